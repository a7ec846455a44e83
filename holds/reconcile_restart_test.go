package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileNamedRunAfterARedisRestart: a named run's calls are recorded on its row as
// they end; Redis restarted since and its tally holds only the last call (or nothing). The
// reconciler settles what the run used, not the tally's part of it nor the run's hold.
func TestReconcileNamedRunAfterARedisRestart(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("dora", 20, nil)
	part := e.admit(u, "x_part", holds.StateRunning)
	none := e.admit(u, "x_none", holds.StateRunning)
	for _, id := range []string{part.RunID, none.RunID} {
		for range 2 {
			if _, err := e.store.RecordRunCall(e.ctx(), id, time.Minute, pricing.Usage{Input: 100, Output: 10}, 700, 1); err != nil {
				t.Fatal(err)
			}
		}
		e.expire(id)
	}
	// After the restart only x_part's second call reached the new Redis.
	e.addTally(part.RunID, pricing.Usage{Input: 100, Output: 10}, 700)
	st, err := e.pass(e.reconciler("me", nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{part.RunID, none.RunID} {
		if r := e.run(u, id); r.State != holds.StateSettled || r.ChargedMicro != 1400 || r.Calls != 2 {
			t.Errorf("run %s %+v (pass %+v): want both calls charged, 1400", id, r, st)
		}
	}
}
