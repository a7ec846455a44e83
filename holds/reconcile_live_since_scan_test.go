package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// extendedWhenAsked is a LeaseChecker that finds no lease, but pushes the hold's expiry out
// as it is asked, as a call of the run admitted again between the reconciler's scan and its
// settlement does.
type extendedWhenAsked struct {
	store *holds.Store
	by    time.Duration
}

func (x extendedWhenAsked) Exists(ctx context.Context, runID string) (bool, error) {
	_, err := x.store.Extend(ctx, runID, x.by)
	return false, err
}

// TestReconcilerLeavesARunAdmittedAgainSinceItsScan: a hold the scan read as expired whose
// run was admitted again before its settlement (its expiry pushed out, a call of it running) is
// left alone by the reconciler's settlement, which is conditional on the hold still being
// expired under its row lock. Unconditional, the run was settled from its tally as it stood,
// and the call running on it then ended on a settled run, charged nothing.
// TestReconcilerDoesNotSettleARunNoLongerExpired shows the store honours the condition; this
// shows the reconciler asks for it.
func TestReconcilerLeavesARunAdmittedAgainSinceItsScan(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("agent", 3, nil)
	h := e.admit(u, "x_scanned_then_admitted_again", holds.StateRunning)
	e.addTally(h.RunID, pricing.Usage{Input: 10, Output: 1}, 1_000)
	e.expire(h.RunID)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.Leases = extendedWhenAsked{store: e.store, by: time.Hour}
	})
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	if st.Settled() != 0 || st.Extended != 1 {
		t.Errorf("pass %+v: want the run admitted again since the scan left to its call, not settled", st)
	}
	if r := e.run(u, h.RunID); r.State != holds.StateRunning {
		t.Fatalf("run %s with %d µUSD charged: want it left running, its call still to be charged", r.State, r.ChargedMicro)
	}
}
