package holds_test

import (
	"fmt"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileOrphansBeyondOnePassDoNotStarveTheRest: more holds of a deleted user than one
// pass reads (batch × max batches) expired first. Each pass passes them over, but a pass that
// stops at its limit must leave the next one to go on where it stopped: starting again from
// the oldest, every pass spent its whole budget on the orphans and the holds of live users
// behind them were never settled.
func TestReconcileOrphansBeyondOnePassDoNotStarveTheRest(t *testing.T) {
	e := newStoreEnv(t)
	gone := e.user("gone", 1000, nil)
	other := e.user("other", 1000, nil)
	const batch, maxBatches = 3, 2
	for i := range 3 * batch * maxBatches {
		h := e.admit(gone, fmt.Sprintf("r_orph_%02d", i), holds.StateRunning)
		if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 HOUR WHERE run_id = ?", h.RunID); err != nil {
			t.Fatal(err)
		}
	}
	var rest []string
	for i := range batch {
		h := e.admit(other, fmt.Sprintf("r_live_%02d", i), holds.StateRunning)
		e.addTally(h.RunID, pricing.Usage{Input: 10, Output: 1}, 1_000)
		e.expire(h.RunID)
		rest = append(rest, h.RunID)
	}
	if _, err := e.db.ExecContext(e.ctx(), "DELETE FROM users WHERE id = ?", gone.ID); err != nil {
		t.Fatal(err)
	}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Batch, c.MaxBatches = batch, maxBatches })
	for range 6 {
		st, err := e.pass(rec)
		t.Logf("pass: %+v, %v", st, err)
	}
	for _, id := range rest {
		if r := e.run(other, id); r.State != holds.StateSettled || r.ChargedMicro != 1_000 {
			t.Errorf("hold %s behind the orphans: %s, charged %d; want settled at 1000", id, r.State, r.ChargedMicro)
		}
	}
}

// TestReconcileOrphanCountsAsAnErrorOutcomeEachPass: a hold whose user row is gone fails no
// pass (the pass ends done, so tollgate_reconcile_passes_total shows nothing), and its error
// line is capped per pass; the README names tollgate_reconciled_total{outcome="error"} as the
// series that shows it, counted at every pass that reads it again.
func TestReconcileOrphanCountsAsAnErrorOutcomeEachPass(t *testing.T) {
	e := newStoreEnv(t)
	gone := e.user("gone", 1000, nil)
	h := e.admit(gone, "r_orphan", holds.StateRunning)
	e.expire(h.RunID)
	if _, err := e.db.ExecContext(e.ctx(), "DELETE FROM users WHERE id = ?", gone.ID); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int{}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.OnOutcome = func(o string) { outcomes[o]++ } })
	for range 2 {
		if _, err := e.pass(rec); err != nil {
			t.Fatalf("pass failed on an orphaned hold alone: %v", err)
		}
	}
	if outcomes[holds.OutcomeError] != 2 || len(outcomes) != 1 {
		t.Fatalf("outcomes over two passes = %v, want %q twice", outcomes, holds.OutcomeError)
	}
}

// TestReconcileScanGoesOnPastTheHoldItLastRead: each batch of the scan starts strictly after
// the last hold read. A cursor that let the last hold in again (run_id >= instead of >) read an
// orphan at the head of every batch after it: at a batch of one, the scan never got past the
// first orphan, and the holds of live users behind it were never settled.
func TestReconcileScanGoesOnPastTheHoldItLastRead(t *testing.T) {
	e := newStoreEnv(t)
	gone := e.user("gone", 1000, nil)
	other := e.user("other", 1000, nil)
	for i := range 2 {
		h := e.admit(gone, fmt.Sprintf("r_orph_%02d", i), holds.StateRunning)
		if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 HOUR WHERE run_id = ?", h.RunID); err != nil {
			t.Fatal(err)
		}
	}
	live := e.admit(other, "r_behind", holds.StateRunning)
	e.addTally(live.RunID, pricing.Usage{Input: 10, Output: 1}, 1_000)
	e.expire(live.RunID)
	if _, err := e.db.ExecContext(e.ctx(), "DELETE FROM users WHERE id = ?", gone.ID); err != nil {
		t.Fatal(err)
	}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Batch, c.MaxBatches = 1, 3 })
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	if st.Orphans != 2 || st.FromTally != 1 {
		t.Errorf("pass of 3 batches of one over 2 orphans and 1 settleable hold: %+v; want each read once, the last settled", st)
	}
	if r := e.run(other, live.RunID); r.State != holds.StateSettled || r.ChargedMicro != 1_000 {
		t.Errorf("hold behind the orphans: %s, charged %d; want settled at 1000", r.State, r.ChargedMicro)
	}
}
