package holds_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileRevisitCursorTiesAndLateRows: the revisit's cursor is (settled_at, run_id), its
// batches small; runs charged their hold in one statement share settled_at, and a run whose
// settled_at lies behind the cursor can appear after the cursor passed it. Every run with a
// tally gets exactly one refund: none skipped at a tie, none granted twice.
func TestReconcileRevisitCursorTiesAndLateRows(t *testing.T) {
	e := newStoreEnvMidday(t)
	u := e.user("revisit-cursor", 50, nil)
	var ids []string
	for i := range 7 {
		id := fmt.Sprintf("r_cur_%02d", i)
		ids = append(ids, id)
		e.admit(u, id, holds.StateRunning)
		e.expire(id)
	}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour; c.Batch = 2 })
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	// All share one settled_at.
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET settled_at = NOW(6) - INTERVAL 1 MINUTE WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[:5] {
		if err := e.tally.RecordCallWith(e.ctx(), id, 1, pricing.Usage{Input: 10}, 100, false, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	if st.PauseRefunds != 5 {
		t.Errorf("first pass refunded %d; want 5", st.PauseRefunds)
	}
	// A late tally on a run the cursor has passed, and one behind it by settled_at.
	for _, id := range ids[5:] {
		if err := e.tally.RecordCallWith(e.ctx(), id, 1, pricing.Usage{Input: 10}, 100, false, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET settled_at = settled_at - INTERVAL 10 SECOND WHERE run_id = ?", ids[6]); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := e.pass(rec); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		var n int
		if err := e.db.GetContext(e.ctx(), &n, "SELECT COUNT(*) FROM grants WHERE idempotency_key = ? AND user_id = ?", holds.PauseRefundKey(id), u.ID); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%s: %d refunds; want 1", id, n)
		}
	}
}
