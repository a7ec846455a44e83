package holds_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestReconcilePrunesEndedSessionsPastOneBatch: a pass prunes ended sessions batch after
// batch while a batch comes back full, up to its batch limit: under chat traffic more
// conversations end between two passes than one batch holds, and a pass that stopped after
// one full batch let the table grow by the rest at every pass.
func TestReconcilePrunesEndedSessionsPastOneBatch(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("chattier", 100, nil)
	const ended, batch = 10, 4 // two full batches, then one of two
	e.endedSessions(u, "b", ended)
	st, err := e.pass(e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Batch = batch }))
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if left := e.sessionsLeft(u); left != 0 || st.PrunedSessions != ended {
		t.Fatalf("after one pass in batches of %d: %d sessions left, %d pruned; want all %d ended ones pruned", batch, left, st.PrunedSessions, ended)
	}
}

// TestReconcilePrunesEndedSessionsPastItsBatchLimit: sessions are pruned by reconcile passes
// alone, a minute apart. A pass stopped pruning at MaxBatches batches (10 000 rows by default),
// so where more conversations ended than that in a minute — a caller naming a new X-Session-Id
// on each request does it at its request rate — the table grew by the rest at every pass, for
// good. The pass's time budget bounds the prune, as it bounds the scan.
func TestReconcilePrunesEndedSessionsPastItsBatchLimit(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("chattiest", 100, nil)
	const ended, batch, maxBatches = 10, 2, 2 // a batch limit of 4 rows a pass
	e.endedSessions(u, "l", ended)
	st, err := e.pass(e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Batch, c.MaxBatches = batch, maxBatches }))
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if left := e.sessionsLeft(u); left != 0 || st.PrunedSessions != ended {
		t.Fatalf("after one pass of at most %d batches of %d: %d sessions left, %d pruned; want all %d ended ones pruned within the pass's time budget",
			maxBatches, batch, left, st.PrunedSessions, ended)
	}
}

// TestReconcilePrunesEndedSessionsBehindABacklogOfExpiredHolds: a pass whose scan of expired
// holds stops at its batch limit still prunes ended sessions. It skipped the prune whenever
// its scan was cut short, so for as long as a backlog of expired holds lasted (a fleet killed
// with thousands of calls in flight, a reconciler behind) no session was pruned and the table
// grew by every conversation that ended meanwhile.
func TestReconcilePrunesEndedSessionsBehindABacklogOfExpiredHolds(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("backlogged", 100, nil)
	const ended, expired, batch, maxBatches = 3, 6, 2, 2 // the scan reads 4 of 6 expired holds
	e.endedSessions(u, "x", ended)
	for i := range expired {
		e.expire(e.admit(u, fmt.Sprintf("r_backlog_x_%d", i), holds.StateQueued).RunID)
	}
	st, err := e.pass(e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Batch, c.MaxBatches = batch, maxBatches }))
	if err != nil || !st.Truncated || st.StoppedAt != holds.StopBatchLimit {
		t.Fatalf("reconcile: %+v, %v; want a pass stopped at its batch limit", st, err)
	}
	if left := e.sessionsLeft(u); left != 0 || st.PrunedSessions != ended {
		t.Fatalf("after a pass cut short by %d expired holds: %d sessions left, %d pruned; want all %d ended ones pruned",
			expired, left, st.PrunedSessions, ended)
	}
}

// endedSessions gives u n sessions whose runs have settled, idle for an hour: past
// SessionPruneIdle, each for a pass to prune.
func (e *storeEnv) endedSessions(u holds.User, tag string, n int) {
	e.t.Helper()
	for i := range n {
		run := fmt.Sprintf("r_ended_%s_%d", tag, i)
		e.admit(u, run, holds.StateRunning)
		if _, err := e.store.ClaimSession(e.ctx(), u.ID, fmt.Sprintf("conv-%s-%d", tag, i), run, sha256.Sum256([]byte(run))); err != nil {
			e.t.Fatal(err)
		}
		if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: run, Source: holds.SourceComplete}); err != nil {
			e.t.Fatal(err)
		}
	}
	if _, err := e.db.ExecContext(e.ctx(), `UPDATE sessions SET updated_at = NOW(6) - INTERVAL 1 HOUR WHERE user_id = ?`, u.ID); err != nil {
		e.t.Fatal(err)
	}
}

// TestReconcilePrunesEndedSessionsBehindABacklogOfPauseRefunds: a pass's revisit of the runs
// charged their hold (refundPaused) reads every such run in tally_ttl whose call truly died, a
// lease and a tally each, at every pass; after a fleet killed with thousands of calls in flight
// that took the whole pass budget, and the prune after it got one batch a pass while more
// conversations ended than that. The prune goes first: its backlog is a minute's, the refunds'
// can wait as long as a tally lives.
func TestReconcilePrunesEndedSessionsBehindABacklogOfPauseRefunds(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("revisit-backlog", 100, nil)
	const dead, ended, batch = 12, 10, 2
	for i := range dead {
		e.expire(e.admit(u, fmt.Sprintf("r_dead_call_%d", i), holds.StateRunning).RunID)
	}
	if st, err := e.pass(e.reconciler("me", nil)); err != nil || st.ChargedHeld != dead {
		t.Fatalf("the dead calls' pass: %+v, %v; want all %d charged their hold", st, err, dead)
	}
	e.endedSessions(u, "r", ended)
	// A dead call's tally read takes the pass's whole budget: the revisit alone outlasts it,
	// whatever the box's pace.
	const budget = 3 * time.Second
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.Usage = slowUsage{tallyUsage{e.tally}, budget}
		c.RefundWindow, c.Batch, c.PassBudget = time.Hour, batch, budget
	})
	st, err := e.pass(rec)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if left := e.sessionsLeft(u); left != 0 || st.PrunedSessions != ended {
		t.Fatalf("after a pass whose revisit of %d dead calls outlasts its budget: %d sessions left, %d pruned; want all %d ended ones pruned",
			dead, left, st.PrunedSessions, ended)
	}
}

// slowUsage is a UsageSource whose every read takes delay first.
type slowUsage struct {
	holds.UsageSource
	delay time.Duration
}

func (s slowUsage) Tallied(ctx context.Context, runID string) (holds.RunTally, bool, error) {
	time.Sleep(s.delay)
	return s.UsageSource.Tallied(ctx, runID)
}

// sessionsLeft is how many sessions rows u has.
func (e *storeEnv) sessionsLeft(u holds.User) int {
	e.t.Helper()
	var left int
	if err := e.db.GetContext(e.ctx(), &left, `SELECT COUNT(*) FROM sessions WHERE user_id = ?`, u.ID); err != nil {
		e.t.Fatal(err)
	}
	return left
}
