package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileFreeModelRunAfterARedisRestartKeepsItsCalls: a free model's calls cost 0, so
// after a Redis restart the tally of the calls since costs what the run's row (every call)
// does. The reconciler took the tally on that tie, and the run settled without the tokens and
// calls of before the restart; it takes the row, which records more (README: a restart loses
// no call that had ended).
func TestReconcileFreeModelRunAfterARedisRestartKeepsItsCalls(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("free_restart", 20, nil)
	run := e.admit(u, "x_free_restart", holds.StateRunning)
	for range 2 {
		if _, err := e.store.RecordRunCall(e.ctx(), run.RunID, token.New(), time.Minute, pricing.Usage{Input: 100, Output: 10}, 0, 1, false); err != nil {
			t.Fatal(err)
		}
	}
	e.expire(run.RunID)
	// After the restart only the second call reached the new Redis.
	e.addTally(run.RunID, pricing.Usage{Input: 100, Output: 10}, 0)
	st, err := e.pass(e.reconciler("me", nil))
	if err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, run.RunID); r.State != holds.StateSettled || r.ChargedMicro != 0 || r.Calls != 2 || r.InTok != 200 || r.OutTok != 20 {
		t.Errorf("run %+v (pass %+v): want settled at 0 with both calls, 200 input and 20 output tokens", r, st)
	}
}

// TestRecordsMoreBreaksACostTieByCalls: the row is taken over the tally when it costs more, or
// as much with more calls; the tally, exact, keeps every other case.
func TestRecordsMoreBreaksACostTieByCalls(t *testing.T) {
	for _, tc := range []struct {
		cost, calls, tallyCost, tallyCalls int64
		want                               bool
	}{
		{700, 1, 600, 2, true},
		{600, 3, 700, 1, false},
		{0, 2, 0, 1, true},
		{0, 1, 0, 1, false},
		{0, 1, 0, 2, false},
	} {
		if got := holds.RecordsMore(tc.cost, tc.calls, tc.tallyCost, tc.tallyCalls); got != tc.want {
			t.Errorf("RecordsMore(%d, %d, %d, %d) = %v, want %v", tc.cost, tc.calls, tc.tallyCost, tc.tallyCalls, got, tc.want)
		}
	}
}
