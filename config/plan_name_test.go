package config

import (
	"strings"
	"testing"
)

// TestPlanNameFitsTheUsersPlanColumn: a user's row keeps its plan's name in users.plan,
// VARCHAR(32). A longer name was accepted at start, and then every user created on that plan
// or moved to it failed with "Data too long for column 'plan'" (500 internal_error from the
// admin API) on a strict server — and on a server without strict mode the name was cut to 32
// characters, which names no configured plan: those users were served on default_plan's
// terms. The start refuses such a name, naming it; 32 characters are accepted.
func TestPlanNameFitsTheUsersPlanColumn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse bool
	}{
		{strings.Repeat("p", 32), false},
		{strings.Repeat("é", 32), false}, // characters, not bytes: the column is utf8mb4
		{strings.Repeat("p", 33), true},
		{"enterprise-annual-contract-2026-tier-a", true},
		{"", true},
	} {
		c := Default()
		c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db"
		c.RedisURL = "redis://127.0.0.1:6379/0"
		c.Plans[tc.name] = c.Plans["standard"]
		err := c.Validate()
		switch {
		case !tc.refuse && err != nil:
			t.Errorf("plan %q refused: %v", tc.name, err)
		case tc.refuse && err == nil:
			t.Errorf("plan %q (%d characters) accepted; users.plan holds 32", tc.name, len([]rune(tc.name)))
		case tc.refuse && !strings.Contains(err.Error(), "plans."+tc.name+":"):
			t.Errorf("plan %q refused without naming it: %v", tc.name, err)
		}
	}
}
