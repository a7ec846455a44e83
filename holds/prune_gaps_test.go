package holds_test

import (
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPruneAddsPrepaidPartsIntoAnExistingSum: runs of one user, day and model pruned in
// different batches are added into one pruned_runs row, every figure of it. Here each run is
// paid from prepaid credits alone, so a prepaid part overwritten rather than added by the
// second batch shows in the prepaid audit (TestPruneKeepsTheBooksAndTheReport has one run with
// a prepaid part).
func TestPruneAddsPrepaidPartsIntoAnExistingSum(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("prepaid-only", "standard")
	zero := int64(0)
	if err := f.store.SetUserLimits(f.ctx(), u.ID, &zero, nil, nil); err != nil {
		t.Fatal(err)
	}
	f.grant(u, 100_000, "topup-"+testenv.RandomID(4))
	for _, id := range []string{"r_p1", "r_p2", "r_p3"} {
		f.admit(u, id)
		if s := f.settle(id, 7_000); s.PrepaidPart != 7_000 {
			t.Fatalf("settlement of %s: %+v, want all of it from prepaid", id, s)
		}
	}
	f.ageRuns(u, 10)
	res, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 1)
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs != 3 || res.Batches != 3 {
		t.Fatalf("pruned %+v, want 3 runs in 3 batches", res)
	}
	var prepaid int64
	if err := f.db.GetContext(f.ctx(), &prepaid, "SELECT prepaid_part_micro FROM pruned_runs WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if prepaid != 21_000 {
		t.Errorf("pruned_runs records %d µUSD taken from prepaid for the three runs, want 21 000", prepaid)
	}
	if m, err := holds.Audit(f.ctx(), f.db); err != nil || len(m) != 0 {
		t.Errorf("audit after the prune: %+v, %v", m, err)
	}
}

// TestAuditFindsALiveHoldCarryingACharge: a hold carries a charge only once settled; a live
// one with charged_micro set (a write outside the store, a broken settlement) is money the day
// ledger does not count yet, and the audit says so.
func TestAuditFindsALiveHoldCarryingACharge(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("live-charge", "standard")
	h := f.admit(u, "r_live_charged")
	set := func(charged int64) {
		t.Helper()
		if _, err := f.db.ExecContext(f.ctx(), "UPDATE run_holds SET charged_micro = ?, allowance_part_micro = ? WHERE run_id = ?",
			charged, charged, h.RunID); err != nil {
			t.Fatal(err)
		}
	}
	set(5_000)
	m, err := holds.Audit(f.ctx(), f.db)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m[0].RunID != h.RunID {
		t.Errorf("audit of a live hold carrying a charge: %+v; want one mismatch naming %s", m, h.RunID)
	}
	set(0)
	f.settle(h.RunID, 0)
}
