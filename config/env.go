package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// applyEnv overrides the settings that differ per deployment. UPSTREAM_URL and
// UPSTREAM_API_KEY apply to the first upstream, the one a single-upstream setup has, and to
// every other upstream at the same base_url: one provider reached in both wire formats (the
// demo's fake upstream serves OpenAI and Anthropic routes).
func (c *Config) applyEnv(getenv func(string) string) {
	set := func(dst *string, name string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	set(&c.MySQLDSN, "MYSQL_DSN")
	set(&c.RedisURL, "REDIS_URL")
	if v := getenv("REDIS_CLUSTER"); v != "" {
		if b, err := strconv.ParseBool(v); err == nil {
			c.RedisCluster = b
		} else {
			c.badRedisClusterEnv = v
		}
	}
	set(&c.ListenAddr, "LISTEN_ADDR")
	set(&c.AdminToken, "ADMIN_TOKEN")
	set(&c.Instance, "TOLLGATE_INSTANCE")
	set(&c.RedisKeyPrefix, "TOLLGATE_REDIS_PREFIX")
	if len(c.Upstreams) > 0 {
		first := c.Upstreams[0]
		for i := range c.Upstreams {
			if u := &c.Upstreams[i]; i == 0 || u.BaseURL == first.BaseURL {
				set(&u.BaseURL, "UPSTREAM_URL")
				// An upstream that names a key of its own (another account at the same
				// provider) keeps it: it shares the first's key only when it names the same
				// variable or none.
				if i == 0 || u.APIKeyEnv == "" || u.APIKeyEnv == first.APIKeyEnv {
					set(&u.APIKey, "UPSTREAM_API_KEY")
				}
			}
		}
	}
	for i := range c.Upstreams {
		if u := &c.Upstreams[i]; u.APIKeyEnv != "" && u.APIKey == "" {
			u.APIKey = getenv(u.APIKeyEnv)
		}
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
}

// envName reports whether s is a portable environment variable name: [A-Za-z_][A-Za-z0-9_]*.
func envName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return s != ""
}

// conventionalEnvName reports whether an envName is written as variables are (OPENAI_API_KEY:
// no lower case letters), and so safe to print: keys mix cases.
func conventionalEnvName(s string) bool { return strings.ToUpper(s) == s }
