package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// TestSigtermWhileAnAdmissionsCommitIsUnanswered: SIGTERM while MariaDB has run an admission's
// COMMIT and its reply has not come back (the server hangs, or the network drops its packets).
// The call's caller never gets an answer and nothing was forwarded, so the hold must not be
// charged. The request waits for the outcome up to the driver's read timeout (30 s), longer
// than the exit's bound (shutdown_timeout + settle_timeout + 5 s, here 17 s): the process exits
// first, leaving a committed hold with no lease, no tally and no mark that its request was
// refused, which the reconciler charges at what it held.
func TestSigtermWhileAnAdmissionsCommitIsUnanswered(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term-admit", 10, nil)
	f := newFreezer(t, w.mysqlAddr())
	g := w.startGatewayWith("gw-admit-frozen", w.config, "MYSQL_DSN="+w.dsnVia(f))
	// The admission's script of writes and COMMIT (its insert names client_run_id, which no
	// other statement's does): the server runs it, its reply does not come back.
	fired := f.freezeAfter("INSERT INTO run_holds (run_id, user_id, client_run_id")
	answered := make(chan int, 1)
	go func() {
		resp, err := do(context.Background(), g, key, chatBody(false, 16, "hello"), nil)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	select {
	case <-fired:
	case <-time.After(15 * time.Second):
		t.Fatal("no admission's COMMIT went out to freeze after")
	}
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, 90*time.Second); err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
	f.thaw()
	t.Logf("the caller got %d (0: no answer)", <-answered)
	checkReleasedAtZero(t, w, u.ID, "gw-reconciler")
}

// TestSigtermAfterItsCallerLeftWhileAnAdmissionsCommitIsUnanswered: as above, but the caller
// gives up first (its client's timeout, which a stalled database brings about) and SIGTERM
// comes after. The request still waits for its admission's outcome, and the process exits
// first: the hold of a call never forwarded must be released at 0 all the same, not charged
// what it held because its request's context had ended before the drain's cut.
func TestSigtermAfterItsCallerLeftWhileAnAdmissionsCommitIsUnanswered(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term-admit-left", 10, nil)
	f := newFreezer(t, w.mysqlAddr())
	g := w.startGatewayWith("gw-admit-left", w.config, "MYSQL_DSN="+w.dsnVia(f))
	fired := f.freezeAfter("INSERT INTO run_holds (run_id, user_id, client_run_id")
	ctx, leave := context.WithCancel(context.Background())
	answered := make(chan error, 1)
	go func() {
		resp, err := do(ctx, g, key, chatBody(false, 16, "hello"), nil)
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	select {
	case <-fired:
	case <-time.After(15 * time.Second):
		t.Fatal("no admission's COMMIT went out to freeze after")
	}
	leave() // the caller gives up; the gateway sees its connection close well before the drain's cut
	if err := <-answered; err == nil {
		t.Fatal("the caller who left got an answer")
	}
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, 90*time.Second); err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
	f.thaw()
	checkReleasedAtZero(t, w, u.ID, "gw-reconciler-left")
}

// checkReleasedAtZero checks that the user's one hold, whose admission's COMMIT reached the
// server while its call was never forwarded, is settled at 0 by the reconciler of a gateway
// started under reconciler, and that the day ledger agrees.
func checkReleasedAtZero(t *testing.T, w *world, userID uint64, reconciler string) {
	t.Helper()
	var runs []string
	if err := w.db.Select(&runs, "SELECT run_id FROM run_holds WHERE user_id = ?", userID); err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 {
		t.Fatalf("holds of the user %v: want the one whose COMMIT reached the server", runs)
	}
	w.startGateway(reconciler)
	waitFor(t, 60*time.Second, "the reconciler to settle the hold", func() bool { return w.liveHolds() == 0 })
	r := w.hold(runs[0])
	if r.ChargedMicro != 0 {
		t.Errorf("hold %s of a call never forwarded: settled by %q charged %d (held %d), want 0",
			r.RunID, r.SettleSource.String, r.ChargedMicro, r.HeldMicro)
	}
	if got := w.ledgerUsed(userID); got != r.ChargedMicro {
		t.Errorf("day ledger %d, want %d", got, r.ChargedMicro)
	}
}
