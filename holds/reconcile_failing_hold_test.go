package holds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// unreadableFor is a tally whose reads fail for some runs and only those: a Redis Cluster
// whose shard holding those runs' keys is down, the rest of the cluster answering.
type unreadableFor struct {
	tallyUsage
	runs map[string]bool
}

func (u unreadableFor) Tallied(ctx context.Context, runID string) (holds.RunTally, bool, error) {
	if u.runs[runID] {
		return holds.RunTally{}, false, fmt.Errorf("redis: CLUSTERDOWN the slot of %s is not served", runID)
	}
	return u.tallyUsage.Tallied(ctx, runID)
}

// TestReconcileFailingHoldDoesNotStarveTheBatchesBehindIt: the oldest expired hold fails every
// pass (its tally unreadable), while the holds behind it settle when asked. A scan that stopped
// at the end of any batch in which a hold failed never read past the first batch for as long as
// that one hold kept failing: every other expired hold behind it stayed live, its credits held.
// The pass still says it failed, so the operator sees the stuck hold.
func TestReconcileFailingHoldDoesNotStarveTheBatchesBehindIt(t *testing.T) {
	e := newStoreEnv(t)
	stuck := e.user("stuck", 10, nil)
	other := e.user("other", 100, nil)
	e.expiredFirst(e.admit(stuck, "r_stuck", holds.StateRunning).RunID)
	const batch = 3
	behind := e.expiredWithTallies(other, 4*batch)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.Batch, c.MaxBatches = batch, 10
		c.Usage = unreadableFor{tallyUsage{e.tally}, map[string]bool{"r_stuck": true}}
	})
	st, err := e.pass(rec)
	if err == nil || !strings.Contains(err.Error(), "r_stuck") {
		t.Errorf("pass over a hold that failed: error %v; want one naming r_stuck", err)
	}
	if st.FromTally != len(behind) {
		t.Errorf("pass settled %d holds from their tallies (stats %+v); want the %d behind the failing one", st.FromTally, st, len(behind))
	}
	for _, id := range behind {
		if r := e.run(other, id); r.State != holds.StateSettled || r.ChargedMicro != 1_000 {
			t.Errorf("hold %s behind the failing one: %s, charged %d; want settled at 1000", id, r.State, r.ChargedMicro)
		}
	}
	if r := e.run(stuck, "r_stuck"); r.State != holds.StateRunning {
		t.Errorf("the hold whose tally cannot be read: %s; want left running for a later pass", r.State)
	}
}

// TestReconcileBatchOfFailingHoldsHoldsNobodyUpPastAPass: a whole batch of the oldest expired
// holds fails every pass. The scan stops at such a batch (it looks like an outage), but the
// next pass goes on after it: starting again from the oldest, every pass read the same failing
// batch and stopped, and the holds behind it never settled.
func TestReconcileBatchOfFailingHoldsHoldsNobodyUpPastAPass(t *testing.T) {
	e := newStoreEnv(t)
	stuck := e.user("stuck", 10, nil)
	other := e.user("other", 100, nil)
	const batch = 3
	unreadable := map[string]bool{}
	for i := range batch {
		h := e.admit(stuck, fmt.Sprintf("r_stuck_%02d", i), holds.StateRunning)
		e.expiredFirst(h.RunID)
		unreadable[h.RunID] = true
	}
	behind := e.expiredWithTallies(other, 2*batch)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.Batch, c.MaxBatches = batch, 10
		c.Usage = unreadableFor{tallyUsage{e.tally}, unreadable}
	})
	st, err := e.pass(rec)
	if err == nil || st.Errors != batch || st.FromTally != 0 {
		t.Errorf("first pass, its first batch all failing: %+v, %v; want it stopped there with %d errors", st, err, batch)
	}
	st, err = e.pass(rec)
	t.Logf("second pass: %+v, %v", st, err)
	for _, id := range behind {
		if r := e.run(other, id); r.State != holds.StateSettled || r.ChargedMicro != 1_000 {
			t.Errorf("hold %s behind a batch of failing ones, after two passes: %s, charged %d; want settled at 1000", id, r.State, r.ChargedMicro)
		}
	}
	// The backlog drained, the pass after starts again from the oldest: the failing holds are
	// tried again every other pass, not forgotten.
	st, err = e.pass(rec)
	if st.Errors != batch {
		t.Errorf("third pass: %+v, %v; want the %d failing holds tried again", st, err, batch)
	}
}

// expiredFirst moves a hold's expiry an hour into the past: ahead of every hold expire moved.
func (e *storeEnv) expiredFirst(runID string) {
	e.t.Helper()
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 HOUR WHERE run_id = ?", runID); err != nil {
		e.t.Fatal(err)
	}
}

// expiredWithTallies admits n holds of u, each with a tally of 1 000 µUSD, and expires them:
// holds a pass settles from their tallies. It returns their run ids.
func (e *storeEnv) expiredWithTallies(u holds.User, n int) []string {
	e.t.Helper()
	var ids []string
	for i := range n {
		h := e.admit(u, fmt.Sprintf("r_behind_%02d", i), holds.StateRunning)
		e.addTally(h.RunID, pricing.Usage{Input: 10, Output: 1}, 1_000)
		e.expire(h.RunID)
		ids = append(ids, h.RunID)
	}
	return ids
}
