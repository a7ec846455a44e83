package holds_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

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

// TestSessionClaimWhoseCommitReplyWasLostYieldsToANewerMessage: a claim R takes a session
// from a live run A and commits, but its reply is lost; before its retry a newer message C
// claims the session (replacing R). The retry found C current and took the session back,
// answering C as the run it replaced: both newer messages were stopped, and A, which R's
// committed attempt had replaced, was named by nobody and ran to its end, charged in full.
// The retry must now answer that R was superseded, with A as what it replaced, and leave the
// session on C.
func TestSessionClaimWhoseCommitReplyWasLostYieldsToANewerMessage(t *testing.T) {
	f, lossy, dsn := newLossyFixtureDSN(t)
	ctx := context.Background()
	// A handle on the same database around the lossy network: the newer message's gateway.
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tcp"
	db, err := holds.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	other := holds.NewStore(db, settlePlans, "standard", zap.NewNop())

	a, r, c := "r_sess_a_"+testenv.RandomID(4), "r_sess_r_"+testenv.RandomID(4), "r_sess_c_"+testenv.RandomID(4)
	for _, id := range []string{a, r, c} {
		if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: id, UserID: f.user.ID, SessionID: "s_lost", Model: "m",
			State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if cl, err := f.store.ClaimSession(ctx, f.user.ID, "s_lost", a, sha256.Sum256([]byte("A"))); err != nil || cl.Current != a {
		t.Fatalf("A's claim: %+v, %v", cl, err)
	}
	// R's claim commits and the network goes down with its reply: R retries until Restore.
	lossy.Arm("COMMIT", testenv.GoDown)
	type result struct {
		claim holds.SessionClaim
		err   error
	}
	done := make(chan result, 1)
	go func() {
		cl, err := f.store.ClaimSession(ctx, f.user.ID, "s_lost", r, sha256.Sum256([]byte("R")))
		done <- result{cl, err}
	}()
	deadline := time.Now().Add(testenv.LossyDeadline)
	for !lossy.Down() {
		if time.Now().After(deadline) {
			t.Fatal("R's claim's COMMIT reply was never lost")
		}
		time.Sleep(2 * time.Millisecond)
	}
	cl, err := other.ClaimSession(ctx, f.user.ID, "s_lost", c, sha256.Sum256([]byte("C")))
	if err != nil || cl.Current != c || cl.Replaced != r {
		t.Fatalf("C's claim: %+v, %v; want current %s, replaced %s", cl, err, c, r)
	}
	lossy.Restore()
	got := <-done
	if got.err != nil || !got.claim.Superseded || got.claim.Current != c || got.claim.Replaced != a {
		t.Fatalf("R's claim, its commit reply lost and C come since: %+v, %v; want superseded by %s, replaced %s",
			got.claim, got.err, c, a)
	}
	var current string
	if err := db.Get(&current, "SELECT current_run_id FROM sessions WHERE user_id = ?", f.user.ID); err != nil || current != c {
		t.Fatalf("session is on %q (%v), want the newer message's %s", current, err, c)
	}
	if claimed, replaced, err := other.SessionClaimOf(ctx, r); err != nil || !claimed || replaced != a {
		t.Fatalf("R's claim record: %v %q %v; want claimed, replaced %s", claimed, replaced, err, a)
	}
	for _, id := range []string{a, r, c} {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}
