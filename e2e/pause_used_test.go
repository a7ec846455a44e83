package e2e

import (
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestPaidCallForwardedAfterThePauseIsChargedWhatItUsed: the pause catches a call between its
// hold's COMMIT and its forward (TestGatewayPausedBetweenItsHoldAndTheForward's scene), the
// peer's reconciler charges the unleased, untallied hold what it held (reconcile_hold), and
// the call, resumed, is forwarded as the call it paid for and answered whole. Its own
// settlement, at what it used, finds the run settled and changes nothing (first settlement
// wins): the user paid the whole hold, 20 000 µUSD, for a call that used a few hundred. The
// gateway, which alone knows what the call used, gives back the difference by a grant keyed by
// the run: the user's balance is what it was less the call's price, and the books audit clean.
func TestPaidCallForwardedAfterThePauseIsChargedWhatItUsed(t *testing.T) {
	w, g, _, key := newPausedWorld(t, "paused-used")
	before := w.available(w.u.ID)
	s, r := pausedBeforeForward(t, w, g, key, map[string]string{"X-Fake-Chunks": "12"}, w.latestHold())
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
		t.Fatalf("the scene did not happen: the hold settled %s at %d", r.SettleSource.String, r.ChargedMicro)
	}
	if !s.complete {
		t.Fatalf("the call paid under the pause was answered %d %s, not whole", s.status, s.code)
	}
	used := min(pricing.ApplyDiscount(w.price.Cost(s.usage), r.DiscountBP), r.CapMicro)
	if used <= 0 || used >= r.ChargedMicro {
		t.Fatalf("the scene did not happen: the call used %d µUSD of a hold charged %d", used, r.ChargedMicro)
	}
	refunded := w.pauseRefund(t, r.RunID, "what the call did not use")
	if want := r.ChargedMicro - used; refunded != want {
		t.Errorf("granted back %d µUSD, want the hold's charge %d less what the call used %d: %d", refunded, r.ChargedMicro, used, want)
	}
	after := w.available(w.u.ID)
	if want := before - used; after != want {
		t.Errorf("available %d µUSD after the call, want %d: %d before, less the %d it used", after, want, before, used)
	}
	w.books(t, r.ChargedMicro)
}
