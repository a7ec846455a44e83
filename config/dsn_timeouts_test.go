package config

import (
	"strings"
	"testing"
)

// TestNegativeDSNTimeoutsAreRefused: the start holds settle_timeout + admit_timeout + the DSN's
// readTimeout (30 s unless the DSN sets one) below the longest a call may live, since a COMMIT
// the database stalls is waited for up to that read timeout (README, config.example.yaml). The
// driver applies a read, write or dial timeout only when it is above 0, and the gateway puts
// its own in place of 0 alone: a DSN with readTimeout=-1s (a "no timeout" meant, or a typo) was
// accepted, checked as if it were 30 s, and every reply of the database then waited without
// bound — a settlement past the mark that closes its run, a batch behind a stalled COMMIT for
// ever. A negative timeout in the DSN stops the start naming mysql_dsn.
func TestNegativeDSNTimeoutsAreRefused(t *testing.T) {
	for _, param := range []string{"readTimeout=-1s", "writeTimeout=-5s", "timeout=-1ms"} {
		c := Default()
		c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db?" + param
		c.RedisURL = "redis://127.0.0.1:6379/0"
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "mysql_dsn (MYSQL_DSN)") {
			t.Errorf("DSN with %s: %v, want it refused naming mysql_dsn", param, err)
		}
	}
	c := Default()
	c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db?readTimeout=10s&writeTimeout=0s"
	c.RedisURL = "redis://127.0.0.1:6379/0"
	if err := c.Validate(); err != nil {
		t.Errorf("DSN with positive and zero timeouts refused: %v", err)
	}
}
