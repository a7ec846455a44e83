package holds_test

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPruneSessionsDoesNotWaitForALiveRunsLock: a session idle for a while whose run is still
// live (an agent between two long steps) is not pruned, and its run's row is the money path's:
// a batch settling or admitting that run holds its row lock. The prune must not read that row
// under a lock of its own (a DELETE's subquery takes shared locks): it would wait behind the
// batch, its share lock would in turn hold up the next batch of that run's user, and the
// sessions rows it had already taken would hold up their claims.
func TestPruneSessionsDoesNotWaitForALiveRunsLock(t *testing.T) {
	e := newStoreEnv(t)
	e.store.SetRetry(holds.RetryPolicy{MaxConflictRetries: 0, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	u := e.user("agent", 100, nil)
	e.admit(u, "r_prune_ended", holds.StateRunning)
	if _, err := e.store.ClaimSession(e.ctx(), u.ID, "conv-ended", "r_prune_ended", sha256.Sum256([]byte("a"))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: "r_prune_ended", Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	e.admit(u, "r_prune_live", holds.StateRunning)
	if _, err := e.store.ClaimSession(e.ctx(), u.ID, "conv-live", "r_prune_live", sha256.Sum256([]byte("b"))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(e.ctx(), `UPDATE sessions SET updated_at = NOW(6) - INTERVAL 1 HOUR WHERE user_id = ?`, u.ID); err != nil {
		t.Fatal(err)
	}
	// A batch is settling the live run: it holds the run's row lock.
	tx := testenv.ConsoleTx(t, e.db)
	var state string
	if err := tx.GetContext(e.ctx(), &state, "SELECT state FROM run_holds WHERE run_id = 'r_prune_live' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	n, err := e.store.PruneSessions(e.ctx(), holds.SessionPruneIdle, 100)
	if err != nil || n != 1 {
		t.Fatalf("prune beside a batch holding a live run's lock: %d deleted, %v; want the ended session deleted without waiting", n, err)
	}
}
