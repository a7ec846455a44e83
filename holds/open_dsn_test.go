package holds_test

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestUnparsableDSNKeepsItsPasswordOutOfTheError: the driver's parse error quotes the part of a
// DSN it could not read, which for a password holding '/' (and no /dbname after the address)
// is the rest of the password; the error reaches the operator's terminal and logs.
func TestUnparsableDSNKeepsItsPasswordOutOfTheError(t *testing.T) {
	const secret = "se/cr%et"
	_, err := holds.Open(context.Background(), "tollgate:"+secret+"@tcp(127.0.0.1:1)")
	if err == nil {
		t.Fatal("an unparsable DSN was accepted")
	}
	if strings.Contains(err.Error(), "cr%et") || strings.Contains(err.Error(), secret) {
		t.Fatalf("the error quotes the password: %v", err)
	}
	if !strings.Contains(err.Error(), "mysql_dsn") {
		t.Errorf("the error does not name the setting: %v", err)
	}
}
