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
		// The user info ends at the last '@', not the first; a fragment is no part of a
		// base_url, and may carry a key.
		{"password holding an @", "http://:p@hunter2@redis.internal:6379/0", ""},
		{"base_url with a key in its fragment", "", "https://llm.internal/#key=hunter2"},
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

// A REDIS_URL whose client_name holds an '@' (tollgate@prod-1: go-redis sends it as is with
// CLIENT SETNAME) is a valid URL, not a password that ended the host part early: it is
// accepted. Every other '@' past the host still is refused (the leaks above, and an option
// go-redis does not know, whose name its error quotes: "unexpected option: hunter2").
func TestRedisURLClientNameMayHoldAnAt(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"redis://127.0.0.1:6379/0?client_name=tollgate@prod-1", true},
		{"redis://default:pw@127.0.0.1:6379/0?client_name=tollgate%40prod-1", true},
		{"redis://:?hunter2=x@redis.internal:6379/0", false},
		{"redis://:?pool_size=hunter2@redis.internal:6379/0", false},
		{"redis://127.0.0.1:6379/0?client_name=a&hunter2@x=1", false},
	} {
		c := Default()
		c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db"
		c.RedisURL = tc.url
		err := c.Validate()
		if tc.ok && err != nil {
			t.Errorf("%s: refused: %v", tc.url, err)
		}
		if !tc.ok {
			if err == nil || !strings.Contains(err.Error(), "redis_url") {
				t.Errorf("%s: accepted (error %v)", tc.url, err)
			} else if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("%s: refusal prints the secret: %v", tc.url, err)
			}
		}
	}
}
