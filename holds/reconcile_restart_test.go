package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/token"
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
			if _, err := e.store.RecordRunCall(e.ctx(), id, token.New(), time.Minute, pricing.Usage{Input: 100, Output: 10}, 700, 1, false); err != nil {
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

// TestReconciledNamedRunKeepsItsEstimatedMark: one of a named run's two calls was charged an
// estimate (no usage report) and marked the row so as it ended; the run abandoned, the
// reconciler settles it from its tally, which carries no such mark. The settled row must
// still say estimated, as it would had the caller settled it.
func TestReconciledNamedRunKeepsItsEstimatedMark(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("erin", 20, nil)
	run := e.admit(u, "x_est", holds.StateRunning)
	for _, est := range []bool{true, false} {
		if _, err := e.store.RecordRunCall(e.ctx(), run.RunID, token.New(), time.Minute, pricing.Usage{Input: 100, Output: 10}, 700, 1, est); err != nil {
			t.Fatal(err)
		}
	}
	e.expire(run.RunID)
	e.addTally(run.RunID, pricing.Usage{Input: 200, Output: 20}, 1400)
	if _, err := e.pass(e.reconciler("me", nil)); err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, run.RunID); r.State != holds.StateSettled || r.ChargedMicro != 1400 || !r.Estimated {
		t.Errorf("run %+v: want settled at 1400 with estimated=1 (one of its calls was an estimate)", r)
	}
}

// TestReconcileNamedRunWhoseTallyIsAheadOfItsRow: the row's record of a named run's calls is
// a lower bound (a RecordRunCall that failed on every try until settle_timeout is missing from
// it); the tally, unless Redis lost it, is exact. A run whose row missed its last call is settled from the tally, which says
// more, not from the row: taking the row whenever it recorded anything charged that call
// nothing.
func TestReconcileNamedRunWhoseTallyIsAheadOfItsRow(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("fay", 20, nil)
	run := e.admit(u, "x_ahead", holds.StateRunning)
	// Two calls ended; only the first reached the row.
	if _, err := e.store.RecordRunCall(e.ctx(), run.RunID, token.New(), time.Minute, pricing.Usage{Input: 100, Output: 10}, 700, 1, false); err != nil {
		t.Fatal(err)
	}
	e.expire(run.RunID)
	e.addTally(run.RunID, pricing.Usage{Input: 100, Output: 10}, 700)
	e.addTally(run.RunID, pricing.Usage{Input: 300, Output: 30}, 2_100)
	st, err := e.pass(e.reconciler("me", nil))
	if err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, run.RunID); r.State != holds.StateSettled || r.ChargedMicro != 2_800 || r.Calls != 2 || r.InTok != 400 {
		t.Errorf("run %+v (pass %+v): want both calls charged from the tally, 2,800 for 400 input tokens", r, st)
	}
}

// TestReconcileNamedRunWhoseCallsAllFailedAfterARedisRestart: a named run's calls all failed
// before using anything; each ended call is still recorded on its row (ended_calls), at 0. Redis
// restarted and lost the run's zero tally. The row's record is what the run used: it settles at
// 0, not at its hold as a run whose usage was lost would.
func TestReconcileNamedRunWhoseCallsAllFailedAfterARedisRestart(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("gil", 20, nil)
	run := e.admit(u, "x_failed", holds.StateRunning)
	if _, err := e.store.RecordRunCall(e.ctx(), run.RunID, token.New(), time.Minute, pricing.Usage{}, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	e.expire(run.RunID)
	st, err := e.pass(e.reconciler("me", nil))
	if err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, run.RunID); r.State != holds.StateSettled || r.ChargedMicro != 0 || r.SettleSource.String != holds.SourceReconcile {
		t.Errorf("run %+v (pass %+v): want settled from its row at 0", r, st)
	}
}
