package e2e

import "testing"

// TestGatewayPausedBetweenItsHoldAndTheForward: a gateway is paused (SIGSTOP) the moment its
// admission's closing script goes out — the server commits the hold; the gateway has not yet
// read that it did — for longer than the hold lives and than admit_timeout, while a peer serves
// and reconciles. The hold has no lease (none is written before the first beat) and no tally,
// so the peer's reconciler charges it what it held (DESIGN §5 rule 3), as it would a killed
// process's. Resumed, the gateway finds its call's admission budget spent: refused so, the
// caller was answered 503 billing_unavailable, "not made, retry shortly", with its hold released
// at 0 — a release that changed nothing, the hold charged — and its retry was charged again.
// The call it paid for must be forwarded instead, as one the pause caught just after its
// forward is, and the books stay whole.
func TestGatewayPausedBetweenItsHoldAndTheForward(t *testing.T) {
	w, g, _, key := newPausedWorld(t, "paused-before-forward")
	s, r := pausedBeforeForward(t, w, g, key, map[string]string{"X-Fake-Chunks": "12"}, w.latestHold())
	if !s.complete {
		t.Errorf("the caller was answered %d %s (the upstream got %d calls), its hold charged %d by %s: charged for a call it was told was not made",
			s.status, s.code, w.held.calls.Load(), r.ChargedMicro, r.SettleSource.String)
	}
	w.books(t, r.ChargedMicro)
	w.calls.noServerErrors(t)
}
