package config

import (
	"strings"
	"testing"
)

// A refused REDIS_URL or base_url must not print the secret it carries, in whatever part of
// the URL it sits (a password, a token given as the user name, a URL without its scheme that
// parses as opaque or relative): the message goes to stderr and from there to whatever
// collects the deployment's logs.
func TestValidateDoesNotPrintSecrets(t *testing.T) {
	for _, tc := range []struct{ name, redis, base string }{
		{"unix scheme", "unix://:hunter2-redis@/var/run/redis.sock", ""},
		{"bad escape in password", "redis://:hunter2%zz@redis.internal:6379/0", ""},
		{"upstream base_url with credentials", "", "ftp://svc:hunter2-upstream@llm.internal/v1"},
		{"redis URL without its scheme", "default:hunter2-redis@redis.internal:6379", ""},
		{"redis scheme missing colon", "redis//:hunter2-redis@redis.internal:6379/0", ""},
		{"upstream token as user name", "", "htps://hunter2-token@llm.internal/v1"},
		{"upstream URL without scheme", "", "svc:hunter2-upstream@llm.internal/v1"},
		// A password holding '/', '?' or '#' unencoded ends the authority early: the URL
		// parses, and the rest of the password lands in the path or query, which go-redis's
		// own errors quote ("invalid URL path: /hunter2...").
		{"password with a slash, empty before it", "redis://:/hunter2-redis@redis.internal:6379/0", ""},
		{"password with a slash after digits", "redis://:6379/hunter2-redis@redis.internal:6379", ""},
		{"password with a slash after the user", "redis://default:/hunter2-redis@redis.internal:6379/0", ""},
		{"password with a question mark", "redis://:?hunter2-redis@redis.internal:6379/0", ""},
		{"password with a hash", "redis://:#hunter2-redis@redis.internal:6379/0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db"
			c.RedisURL = "redis://127.0.0.1:6379/0"
			if tc.redis != "" {
				c.RedisURL = tc.redis
			}
			if tc.base != "" {
				c.Upstreams[0].BaseURL = tc.base
			}
			err := c.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("validation error prints the secret: %v", err)
			}
		})
	}
}
