package main

import (
	"strings"
	"testing"
)

// TestAuditNamesTheUserOfEachMismatch: `gateway audit` printed every mismatch as
// "user 7 day  run : …", the user by id where every other command names users, and the fields
// a kind of mismatch does not have left blank. It names the user (a deleted one by id, said to
// be gone) and prints only the day of a ledger's mismatch and the run of a charge's.
func TestAuditNamesTheUserOfEachMismatch(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	for _, q := range []string{
		// A day ledger with no settled charge behind it.
		`INSERT INTO usage_days (user_id, day, used_micro, run_count) SELECT id, '2026-11-30', 40, 1 FROM users`,
		// A settled charge, of a user deleted by hand, whose parts do not add up (nor its day).
		`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, charged_micro, allowance_part_micro, cost_micro, model, expires_at, settled_at)
		 VALUES ('r_gone', 999999, 'settled', 100, 100, 40, 10, 40, 'm', NOW(6), NOW(6))`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	out, err := stdout(t, func() error { return auditCmd(ctx, nil) })
	if err == nil {
		t.Fatalf("audit of unbalanced books: %q, no error", out)
	}
	for _, want := range []string{
		"user alice (id ", "), day 2026-11-30: ledger 40 µUSD in 1 runs, settled holds charged 0 µUSD in 0 runs",
		"user id 999999 (no such user), run r_gone: charge parts do not add up",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("audit printed:\n%s\nwant %q", out, want)
		}
	}
	for _, blank := range []string{"day  ", "run :", "day :"} {
		if strings.Contains(string(out), blank) {
			t.Errorf("audit printed:\n%s\nwith a blank field (%q)", out, blank)
		}
	}
}
