package holds_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// budgetLeases is the lease checker of a Redis far enough away (or busy enough) that a
// sweep's share of the pass runs out after per questions: each pass's per-th question inside
// the sweep (the one context with a deadline this close) waits for that deadline and fails
// with it, as a question still on its way when the time is up does.
type budgetLeases struct {
	leaseKeys
	per   int
	mu    sync.Mutex
	asked int
}

// newPass starts counting the questions of the next pass.
func (l *budgetLeases) newPass() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = 0
}

func (l *budgetLeases) Exists(ctx context.Context, runID string) (bool, error) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < 5*time.Second {
		l.mu.Lock()
		l.asked++
		n := l.asked
		l.mu.Unlock()
		if n == l.per {
			<-ctx.Done()
			return false, ctx.Err()
		}
	}
	return l.leaseKeys.Exists(ctx, runID)
}

// TestDeadRowLeasedHoldsPastTheSweepsTimeDoNotHideItsOthers: as
// TestDeadRowLeasedHoldsDoNotHideItsOthers, with the sweep stopped by its time (a quarter of
// the pass's budget) rather than by its batch limit: one lease question a hold, and with Redis
// half a millisecond away the default 5 s run out at about the 10 000 holds the batch limit
// allows. A sweep stopped so kept no place in the row's holds: every pass read them again from
// the first, ran out of time at the same leased hold, and the unleased calls behind them waited
// out their whole hold_ttl, their callers' in-flight slots taken.
func TestDeadRowLeasedHoldsPastTheSweepsTimeDoNotHideItsOthers(t *testing.T) {
	e := newStoreEnv(t)
	f := newDeadRowBehindLeases(t, e, "slow-sweep-user")
	// One hold a batch, batches to spare: each pass's sweep runs out of time at its second hold.
	lk := &budgetLeases{leaseKeys: leaseKeys{e.rdb, e.keys}, per: 2}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.DeadAfter, c.Batch, c.MaxBatches, c.PassBudget, c.Leases = deadBound, 1, 10, 2*time.Second, lk
	})
	for pass := 1; pass <= 10; pass++ {
		lk.newPass()
		if _, err := e.pass(rec); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
	}
	f.check(t, e, "ten passes")
}
