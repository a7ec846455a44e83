package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestSessionMessageThatWaitedDoesNotStopANewerOne: a long message of a session, its hold too
// small while its user's answered call settles, is released and waits to be admitted again
// (admitFitting). A newer message of the same session sent meanwhile is admitted on what that
// release gave back, claims the session and runs. The older message, admitted again once the
// settlement lands, claimed the session back: the newer one, the caller's last word, was
// stopped (409 "A newer message of the same session replaced this call"), charged its
// prompt's estimate, and the older one answered. The older one must be answered superseded
// instead, charged nothing, and the newer one run to its end.
func TestSessionMessageThatWaitedDoesNotStopANewerOne(t *testing.T) {
	h := newHarness(t, aLittleOverTheTier)
	u, key := h.user("standard")
	settling := make(chan struct{})
	var settles, waits atomic.Int32
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		switch step {
		case "settle":
			if settles.Add(1) == 1 {
				<-settling // the first call's settlement, held until the newer message runs
			}
		case "admission waits for a settlement":
			waits.Add(1)
		}
	})
	if a := send(h.gw.URL, key, chatBody, nil); a.status != http.StatusOK {
		close(settling)
		t.Fatalf("first call: %d %s", a.status, a.body)
	}
	older := make(chan answer, 1)
	go func() {
		older <- send(h.gw.URL, key, longPromptBody(3000), map[string]string{proxy.SessionHeader: "s-order"})
	}()
	waitFor(t, "the older message to wait for the settlement", func() bool { return waits.Load() > 0 })
	calls := h.fake.Calls()
	newer := make(chan answer, 1)
	go func() {
		newer <- send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"no, this instead"}]}`,
			map[string]string{proxy.SessionHeader: "s-order", "X-Fake-Latency": "1s"})
	}()
	waitFor(t, "the newer message to reach the upstream", func() bool { return h.fake.Calls() > calls })
	close(settling)
	olderMessageSuperseded(t, h, u.ID, <-older, <-newer, 2)
}

// olderMessageSuperseded checks how a race of two messages of one session ends when the older
// one's admission waited for a settlement and the newer one claimed the session meanwhile: the
// newer answered whole, the older 409 superseded, and of the user's runs wantComplete charged
// complete (the calls answered before the race, and the newer message), the rest released at 0.
func olderMessageSuperseded(t *testing.T, h *harness, userID uint64, older, newer answer, wantComplete int) {
	t.Helper()
	if newer.status != http.StatusOK {
		t.Errorf("the newer message: %d %s; want 200, not stopped by the older one", newer.status, newer.body)
	}
	if older.status != http.StatusConflict || errorCode(t, older.body) != "superseded" {
		t.Errorf("the older message, admitted after the newer claimed the session: %d %s; want 409 superseded", older.status, older.body)
	}
	h.settled()
	var charged int
	for _, r := range h.holdsOf(userID) {
		switch {
		case r.State != holds.StateSettled:
			t.Errorf("run %s left %s", r.RunID, r.State)
		case r.SettleSource.String == holds.SourceComplete && r.ChargedMicro > 0:
			charged++
		case r.SettleSource.String != holds.SourceRelease || r.ChargedMicro != 0:
			t.Errorf("run %s settled by %q charged %d, want the answered calls and the newer message charged, the rest released at 0",
				r.RunID, r.SettleSource.String, r.ChargedMicro)
		}
	}
	if charged != wantComplete {
		t.Errorf("%d runs charged complete, want %d: the calls answered before and the newer message", charged, wantComplete)
	}
}

// TestSessionsNextLongMessageAfterAnAnsweredOneIsServed: the wait above leaves a session's own
// next message alone: a long message sent once the session's previous one was answered, its
// hold too small while that one settles, is admitted again and claims the session from it,
// which its wait read as the session's current run.
func TestSessionsNextLongMessageAfterAnAnsweredOneIsServed(t *testing.T) {
	h := newHarness(t, aLittleOverTheTier)
	u, key := h.user("standard")
	answered := make(chan struct{})
	var waits atomic.Int32
	firstSettlementHeld(h, answered, func(_ context.Context, step string) {
		if step == "admission waits for a settlement" {
			waits.Add(1)
		}
	})
	sess := map[string]string{proxy.SessionHeader: "s-next"}
	sendOK(t, "first message", h.gw.URL, key, chatBody, sess)
	second := send(h.gw.URL, key, longPromptBody(3000), sess)
	close(answered)
	if second.status != http.StatusOK {
		t.Errorf("the session's next, long, message: %d %s; want 200", second.status, second.body)
	}
	if waits.Load() == 0 {
		t.Errorf("the long message never waited: its first hold paid for it (a prompt too short for this test)")
	}
	h.settled()
	chargedOrReleased(t, h.holdsOf(u.ID), "both messages charged, the small hold released at 0")
}
