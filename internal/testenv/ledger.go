package testenv

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
)

// CheckLedger asserts the invariant every money test ends with (holds.Audit): the day
// ledger equals the sum of charged_micro of the holds settled each day, run counts agree, and
// every charge's allowance and prepaid parts add up to it.
func CheckLedger(t testing.TB, db *sqlx.DB) {
	t.Helper()
	bad, err := holds.Audit(context.Background(), db)
	if err != nil {
		t.Fatalf("ledger audit: %v", err)
	}
	for _, m := range bad {
		t.Errorf("ledger audit: user %d day %q run %q: %s", m.UserID, m.Day, m.RunID, m.Detail)
	}
}
