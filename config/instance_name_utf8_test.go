package config

import (
	"strings"
	"testing"
)

// TestInstanceNameThatIsNotUTF8IsRefusedNamingTheSetting: the instance name (TOLLGATE_INSTANCE)
// is recorded in utf8mb4 columns (instances.name, the set_by of credit_unit, plan_terms and the
// fleet's Redis tables). A name holding bytes that are not UTF-8 (an environment variable set
// from a Latin-1 host name or a stray byte) passed the start's checks, and `serve` then failed
// at its first record with "Error 1366 (22007): Incorrect string value: '\xFFname' for column
// `tollgate`.`credit_unit`.`set_by`", naming a column, not the setting, against README's "a
// wrong setting stops the gateway with a message naming it". It is refused naming the setting.
func TestInstanceNameThatIsNotUTF8IsRefusedNamingTheSetting(t *testing.T) {
	c := Default()
	c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db"
	c.RedisURL = "redis://127.0.0.1:6379/0"
	c.Instance = "bad\xffname"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "instance (TOLLGATE_INSTANCE)") {
		t.Fatalf("instance %q: %v, want it refused naming instance (TOLLGATE_INSTANCE)", c.Instance, err)
	}
	c.Instance = "gw-é-1"
	if err := c.Validate(); err != nil {
		t.Errorf("a UTF-8 instance name refused: %v", err)
	}
}
