package config

import (
	"strings"
	"testing"
)

// TestInstanceNameFitsItsColumns: a gateway records its instance name (TOLLGATE_INSTANCE,
// host:pid by default) in instances.name and in the set_by of credit_unit and plan_terms,
// each VARCHAR(255). A longer name was accepted, and the start then failed at its first
// record with "Data too long for column" (name or set_by), naming a column the operator never set
// (on a server without strict mode the name was cut, and two gateways could share one). The
// start refuses it, naming the setting; 255 characters are accepted.
func TestInstanceNameFitsItsColumns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse bool
	}{
		{strings.Repeat("i", 255), false},
		{strings.Repeat("é", 255), false}, // characters, not bytes: the columns are utf8mb4
		{strings.Repeat("i", 256), true},
	} {
		c := Default()
		c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db"
		c.RedisURL = "redis://127.0.0.1:6379/0"
		c.Instance = tc.name
		err := c.Validate()
		switch {
		case !tc.refuse && err != nil:
			t.Errorf("instance of %d characters refused: %v", len([]rune(tc.name)), err)
		case tc.refuse && err == nil:
			t.Errorf("instance of %d characters accepted; its columns hold 255", len([]rune(tc.name)))
		case tc.refuse && !strings.Contains(err.Error(), "instance (TOLLGATE_INSTANCE)"):
			t.Errorf("long instance name refused without naming the setting: %v", err)
		}
	}
}
