package config

import (
	"strings"
	"testing"
)

// A secret read from a file or a secret store often keeps its trailing newline
// (ADMIN_TOKEN="$(cat token)" strips it; a mounted secret as an environment variable does
// not). The admin API trims what a caller sends, so an admin_token with surrounding white
// space can never be matched: every operator request got 401 while the gateway had started
// as if all was well. An upstream key with a newline makes Go refuse the header on every
// call. Both must stop the start, naming the setting and not printing the secret.
func TestSecretsWithSurroundingWhitespaceAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		set        func(c *Config)
	}{
		{"admin token with a trailing newline", "admin_token", func(c *Config) { c.AdminToken = "hunter2-admin-token-0123\n" }},
		{"admin token with a leading space", "admin_token", func(c *Config) { c.AdminToken = " hunter2-admin-token-0123" }},
		{"admin token with a control character", "admin_token", func(c *Config) { c.AdminToken = "hunter2-admin\x00token-0123" }},
		{"upstream key with a trailing newline", "upstreams[0]", func(c *Config) { c.Upstreams[0].APIKey = "sk-hunter2-upstream\r\n" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db"
			c.RedisURL = "redis://127.0.0.1:6379/0"
			tc.set(c)
			err := c.Validate()
			if err == nil {
				t.Fatal("accepted: the secret can never be matched or sent")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("validation error prints the secret: %v", err)
			}
		})
	}
	c := Default()
	c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db"
	c.RedisURL = "redis://127.0.0.1:6379/0"
	c.AdminToken = "an admin token with inner spaces"
	c.Upstreams[0].APIKey = "sk-plain"
	if err := c.Validate(); err != nil {
		t.Fatalf("a token with inner spaces (sendable as is) refused: %v", err)
	}
}
