package e2e

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestCallerWhoLeftDuringThePauseBeforeTheForwardIsRefunded: the pause catches a call between
// its hold's COMMIT and its forward (as TestGatewayPausedBetweenItsHoldAndTheForward's), the
// peer's reconciler charges the unleased, untallied hold what it held (reconcile_hold), and the
// caller leaves while the gateway is stopped (its client's timeout, a load balancer's idle cut).
// Resumed, the gateway finds the caller gone and forwards nothing (499): the charge is for a
// call never made, which its caller's retry pays again. The peer's settlement stands (first
// settlement wins), so the gateway, which alone knows the call was never made, gives the charge
// back by a grant keyed by the run: the user's balance is what it was before the call, and the
// books audit clean. (Or, when the resumed gateway read the admission's reply before its
// caller's close, the call was forwarded after all, charged what it used and given back the
// rest.)
func TestCallerWhoLeftDuringThePauseBeforeTheForwardIsRefunded(t *testing.T) {
	w, g, _, key := newPausedWorld(t, "paused-left")
	ctx := context.Background()
	before := w.available(w.u.ID)
	fired := w.relay.armToStop(g.cmd.Process.Pid, admissionScript)
	cctx, leave := context.WithCancel(ctx)
	defer leave()
	first := make(chan seen, 1)
	go func() {
		first <- readCall(cctx, g, key, chatRequest(false, 40, "the call whose caller leaves during the pause"), map[string]string{"X-Fake-Chunks": "12"}, nil)
	}()
	p := pausedOn(t, g, fired, "closing script")
	var runID string
	waitFor(t, 10*time.Second, "the hold committed", func() bool { runID = w.latestHold()(); return runID != "" })
	waitFor(t, 30*time.Second, "the peer's reconciler to settle the paused process's hold", func() bool {
		return w.hold(runID).State == holds.StateSettled
	})
	r := w.hold(runID)
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
		t.Fatalf("the scene did not happen: the hold settled %s at %d", r.SettleSource.String, r.ChargedMicro)
	}
	// The caller leaves while the gateway is stopped: its connection closes under it.
	leave()
	if s := <-first; s.err == nil {
		t.Fatalf("the caller got an answer from a stopped gateway: %d %s", s.status, s.code)
	}
	p.resume(t)
	// The refund comes either way: a resumed gateway reads its caller's close in the background
	// (net/http's read of the connection), in a race with the admission's reply it reads too,
	// and a gateway that reads the reply first forwards the call before it knows the caller
	// left (a fresh-clone run of stop 66 drew that): the call is then charged what it used,
	// as any call whose caller leaves during its forward, and given back the rest.
	refunded := w.pauseRefund(t, runID, "what the call its caller left did not use")
	if after := w.hold(runID); after.ChargedMicro != r.ChargedMicro || after.SettleSource != r.SettleSource || after.SettledAt != r.SettledAt {
		t.Errorf("the peer's settlement changed after the resume: %s charged %d, was %s charged %d", after.SettleSource.String, after.ChargedMicro, r.SettleSource.String, r.ChargedMicro)
	}
	after := w.available(w.u.ID)
	switch n := w.held.calls.Load(); n {
	case 0:
		if !logLineHas(g.log, runID, "client_closed_request") {
			t.Errorf("the call its caller left was not forwarded, and not refused 499")
		}
		if refunded != r.ChargedMicro {
			t.Errorf("granted back %d µUSD, want the hold's charge %d: the call was never forwarded", refunded, r.ChargedMicro)
		}
	case 1:
		t.Logf("the resumed gateway forwarded the call before it read its caller's close")
		if refunded <= 0 || refunded >= r.ChargedMicro {
			t.Errorf("granted back %d µUSD of the hold's charge %d, want what the forwarded call did not use", refunded, r.ChargedMicro)
		}
	default:
		t.Fatalf("the upstream got %d calls, want none or the one the caller left", n)
	}
	if want := before - (r.ChargedMicro - refunded); after != want {
		t.Errorf("available %d µUSD after the call its caller left, want %d: %d before, less what it was charged and not given back", after, want, before)
	}
	w.books(t, r.ChargedMicro)
}

// logLineHas reports whether a line of the log at path holds both runID and what.
func logLineHas(path, runID, what string) bool {
	b, _ := os.ReadFile(path)
	for l := range bytes.SplitSeq(b, []byte("\n")) {
		if bytes.Contains(l, []byte(runID)) && bytes.Contains(l, []byte(what)) {
			return true
		}
	}
	return false
}

// pauseRefund waits for the grant that gives back what runID's hold was charged beyond what its
// call used (the key pause-refund:{run_id}), what the wait's message names, and returns its
// amount.
func (w *world) pauseRefund(t *testing.T, runID, what string) int64 {
	t.Helper()
	var refunded int64
	waitFor(t, 20*time.Second, what+" given back", func() bool {
		_ = w.db.Get(&refunded, "SELECT COALESCE(SUM(amount_micro), 0) FROM grants WHERE idempotency_key = ?", "pause-refund:"+runID)
		return refunded != 0
	})
	return refunded
}
