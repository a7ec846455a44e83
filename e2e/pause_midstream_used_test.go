package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestCallPausedMidStreamPastItsHoldIsChargedWhatItUsed: a plain stream's gateway is stopped
// (SIGSTOP) after its first event, past its lease and its hold's life, while a peer reconciles:
// the hold, unleased and untallied, is charged what it held (reconcile_hold). Resumed, the call
// streams to its end and its settlement, at what it used, finds the run settled. The first
// settlement stands, but the gateway, which knows what the call used, gives back the rest of
// the hold by a grant keyed by the run: the user is charged the call's price, not its hold.
func TestCallPausedMidStreamPastItsHoldIsChargedWhatItUsed(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("paused-mid-stream", 10, nil)
	p := w.startGateway("gw-paused")
	w.startGateway("gw-peer")
	ctx := context.Background()
	before := w.available(u.ID)
	var all allCalls
	c := all.start(t, p, key, chatRequest(true, 100, "a stream the pause catches"), map[string]string{"X-Fake-Chunks": "80", "X-Fake-Chunk-Interval": "40ms"})
	c.waitFirst(t, "the stream")
	runID := c.runID()
	p.signal(t, syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	waitFor(t, 30*time.Second, "the peer's reconciler to settle the paused process's hold", func() bool {
		return w.hold(runID).State == holds.StateSettled
	})
	r := w.hold(runID)
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
		t.Fatalf("the scene did not happen: the hold settled %s at %d", r.SettleSource.String, r.ChargedMicro)
	}
	p.signal(t, syscall.SIGCONT)
	stopped = false
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the stream: no end 30s after the resume")
	}
	if !c.res.complete {
		t.Fatalf("the stream on the resumed process: %d %s, want its whole answer", c.res.status, c.res.code)
	}
	used := min(w.price.Cost(c.res.usage), r.CapMicro)
	if used <= 0 || used >= r.ChargedMicro {
		t.Fatalf("the scene did not happen: the call used %d µUSD of a hold charged %d", used, r.ChargedMicro)
	}
	refunded := w.pauseRefund(t, runID, "what the call did not use")
	if want := r.ChargedMicro - used; refunded != want {
		t.Errorf("granted back %d µUSD, want the hold's charge %d less what the call used %d: %d", refunded, r.ChargedMicro, used, want)
	}
	if after := w.hold(runID); after.ChargedMicro != r.ChargedMicro || after.SettleSource != r.SettleSource {
		t.Errorf("the peer's settlement changed after the resume: %s charged %d", after.SettleSource.String, after.ChargedMicro)
	}
	after := w.available(u.ID)
	if want := before - used; after != want {
		t.Errorf("available %d µUSD after the call, want %d: %d before, less the %d it used", after, want, before, used)
	}
	if bad, err := holds.Audit(ctx, w.db); err != nil || len(bad) > 0 {
		t.Errorf("ledger audit: %v %+v", err, bad)
	}
}
