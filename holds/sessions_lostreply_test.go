package holds_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestLostCommitReplyOfASessionClaimNamesTheReplacedRun: a claim that takes a session from a
// live run asking another message commits, but its reply is lost with the connection. The
// retry finds the session already pointing at its own run; it must still answer the run its
// first attempt replaced — the caller cancels that one, and told nothing, the superseded run
// went on to its end and was charged for an answer nobody wanted.
func TestLostCommitReplyOfASessionClaimNamesTheReplacedRun(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	admit := func(runID string) {
		t.Helper()
		if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: runID, UserID: f.user.ID, SessionID: "s_lost", Model: "m",
			State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	first, second := "r_sess_a_"+testenv.RandomID(4), "r_sess_b_"+testenv.RandomID(4)
	admit(first)
	if c, err := f.store.ClaimSession(ctx, f.user.ID, "s_lost", first, sha256.Sum256([]byte("hello"))); err != nil || c.Current != first {
		t.Fatalf("first claim: %+v, %v", c, err)
	}
	admit(second)
	lossy.Arm("COMMIT", testenv.LoseReply)
	c, err := f.store.ClaimSession(ctx, f.user.ID, "s_lost", second, sha256.Sum256([]byte("something else")))
	if !lossy.Fired() {
		t.Fatal("the claim's commit reply was never lost")
	}
	if err != nil || c.Duplicate || c.Current != second || c.Replaced != first {
		t.Fatalf("claim whose commit reply was lost: %+v, %v; want current %s, replaced %s", c, err, second, first)
	}
	// Another call of the same run claims the session again: it replaced nothing.
	if c, err := f.store.ClaimSession(ctx, f.user.ID, "s_lost", second, sha256.Sum256([]byte("something else"))); err != nil || c.Replaced != "" {
		t.Fatalf("the run's next claim: %+v, %v; want nothing replaced", c, err)
	}
	for _, id := range []string{first, second} {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}
