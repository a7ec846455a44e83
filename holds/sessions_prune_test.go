package holds_test

import (
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestReconcilePrunesEndedSessions: a sessions row decides something only while its current
// run is live (ClaimSession treats a session whose run has ended as new). Without pruning,
// every X-Session-Id ever sent keeps its row for good: under sustained chat traffic, where a
// UI mints one per conversation, the table only grows. A reconcile pass deletes the rows whose
// current run has settled and that no claim has touched for a while, and keeps the others.
func TestReconcilePrunesEndedSessions(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("chatty", 100, nil)
	claim := func(session, runID string) {
		t.Helper()
		if _, err := e.store.ClaimSession(e.ctx(), u.ID, session, runID, sha256.Sum256([]byte(runID))); err != nil {
			t.Fatal(err)
		}
	}
	const ended = 30
	for i := range ended {
		run := fmt.Sprintf("r_ended_%d", i)
		e.admit(u, run, holds.StateRunning)
		claim(fmt.Sprintf("conv-%d", i), run)
		if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: run, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	// The conversations went quiet a while ago.
	if _, err := e.db.ExecContext(e.ctx(), `UPDATE sessions SET updated_at = NOW(6) - INTERVAL 1 HOUR`); err != nil {
		t.Fatal(err)
	}
	// Kept: a session whose run is still going, and one whose run ended moments ago (a claim
	// may be on its way).
	e.admit(u, "r_live", holds.StateRunning)
	claim("conv-live", "r_live")
	if _, err := e.db.ExecContext(e.ctx(), `UPDATE sessions SET updated_at = NOW(6) - INTERVAL 1 HOUR WHERE session_id = 'conv-live'`); err != nil {
		t.Fatal(err)
	}
	e.admit(u, "r_just_ended", holds.StateRunning)
	claim("conv-recent", "r_just_ended")
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: "r_just_ended", Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}

	if _, err := e.pass(e.reconciler("me", nil)); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	var left []string
	if err := e.db.SelectContext(e.ctx(), &left, `SELECT session_id FROM sessions WHERE user_id = ? ORDER BY session_id`, u.ID); err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || left[0] != "conv-live" || left[1] != "conv-recent" {
		t.Fatalf("sessions left after a reconcile pass: %d %v; want only conv-live and conv-recent (%d ended conversations keep their rows for good)",
			len(left), left[:min(len(left), 5)], ended)
	}
	// A pruned session is a new one to its next claim, as an ended one was.
	e.admit(u, "r_again", holds.StateRunning)
	c, err := e.store.ClaimSession(e.ctx(), u.ID, "conv-0", "r_again", sha256.Sum256([]byte("r_ended_0")))
	if err != nil || c.Duplicate || c.Replaced != "" || c.Current != "r_again" {
		t.Fatalf("claim of a pruned session: %+v, %v", c, err)
	}
}
