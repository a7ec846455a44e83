package holds_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestAuditFindsADayLedgerRunCountOrANegativeChargeAmiss: the day ledger counts the runs that
// charged anything beside their sum, and a day whose run_count is off while its sum is right is
// a mismatch of its own; a charge below zero is one even when its parts add up to it. Either
// went unreported when the audit compared only the sums, or only the parts.
func TestAuditFindsADayLedgerRunCountOrANegativeChargeAmiss(t *testing.T) {
	db := testenv.MySQL(t)
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	ctx := context.Background()
	u, err := st.CreateUser(ctx, "audited-runs", "standard")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: "r_audit_runs", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Settle(ctx, holds.Settlement{RunID: "r_audit_runs", UserID: u.ID, CostMicro: 700, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	if bad, err := holds.Audit(ctx, db); err != nil || len(bad) != 0 {
		t.Fatalf("sound books: %v %v", bad, err)
	}
	if _, err := db.Exec("UPDATE usage_days SET run_count = run_count + 1 WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	bad, err := holds.Audit(ctx, db)
	if err != nil || len(bad) != 1 || bad[0].UserID != u.ID || bad[0].Day == "" || !strings.Contains(bad[0].Detail, "in 2 runs") {
		t.Fatalf("day ledger counting 2 runs of 1: %+v %v; want one mismatch of the user's day", bad, err)
	}
	if _, err := db.Exec("UPDATE usage_days SET run_count = run_count - 1 WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	// A second run charged -5 (its allowance part -5): the day's sum and prepaid stay explained.
	if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: "r_audit_neg", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Settle(ctx, holds.Settlement{RunID: "r_audit_neg", UserID: u.ID, Source: holds.SourceRelease}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE run_holds SET charged_micro = -5, allowance_part_micro = allowance_part_micro - 5 WHERE run_id = 'r_audit_neg'"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE usage_days SET used_micro = used_micro - 5 WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	bad, err = holds.Audit(ctx, db)
	if err != nil || len(bad) != 1 || bad[0].RunID != "r_audit_neg" {
		t.Fatalf("a run charged -5 in parts that add up: %+v %v; want one mismatch naming r_audit_neg", bad, err)
	}
	if _, err := db.Exec("UPDATE run_holds SET charged_micro = 0, allowance_part_micro = allowance_part_micro + 5 WHERE run_id = 'r_audit_neg'"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE usage_days SET used_micro = used_micro + 5 WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
}
