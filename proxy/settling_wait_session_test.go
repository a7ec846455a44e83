package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestSessionMessageThatWaitedForASlotDoesNotStopANewerOne: a message of a session refused for
// want of a max_in_flight slot while its user's answered calls settle waits for one of those
// settlements (admitWaitingForSettlements). The first one to land frees a slot; a newer message
// of the same session takes it (the older one's admission is still under way), claims the
// session and runs. The older message, refused again, waits for the next settlement, is
// admitted, and its claim took the session back: the newer one, the caller's last word, was
// stopped (409, charged what it used) and the older one run in full. As for a message whose
// hold was too small (TestSessionMessageThatWaitedDoesNotStopANewerOne), the older one must be
// answered superseded, charged nothing, and the newer one run to its end.
func TestSessionMessageThatWaitedForASlotDoesNotStopANewerOne(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxInFlight = 2
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	gates := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	olderAgain, letOlder := make(chan struct{}), make(chan struct{})
	defer func() {
		for _, g := range []chan struct{}{gates[0], gates[1], letOlder} {
			select {
			case <-g:
			default:
				close(g)
			}
		}
	}()
	var settles, admits, waits atomic.Int32
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		switch step {
		case "settle":
			if n := settles.Add(1); n <= 2 {
				<-gates[n-1] // the two answered calls' settlements, held until let go
			}
		case "admit":
			if admits.Add(1) == 4 {
				// The older message's admission after the first settlement: held until the
				// newer message runs.
				close(olderAgain)
				<-letOlder
			}
		case "admission waits for a settlement":
			waits.Add(1)
		}
	})
	for i := range 2 {
		sendOK(t, fmt.Sprintf("call %d", i+1), h.gw.URL, key, chatBody, nil)
	}
	sess := map[string]string{proxy.SessionHeader: "s-slot"}
	older := make(chan answer, 1)
	go func() { older <- send(h.gw.URL, key, chatBody, sess) }()
	waitFor(t, "the older message to wait for a settlement", func() bool { return waits.Load() == 1 })
	close(gates[0])
	<-olderAgain
	calls := h.fake.Calls()
	newer := make(chan answer, 1)
	go func() {
		newer <- send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"no, this instead"}]}`,
			map[string]string{proxy.SessionHeader: "s-slot", "X-Fake-Latency": "3s"})
	}()
	waitFor(t, "the newer message to reach the upstream", func() bool { return h.fake.Calls() > calls })
	close(letOlder)
	waitFor(t, "the older message, refused again, to wait for the next settlement", func() bool { return waits.Load() == 2 })
	close(gates[1])
	olderMessageSuperseded(t, h, u.ID, <-older, <-newer, 3)
}

// TestSessionsNextMessageThatWaitsForASlotIsServed: the wait above leaves a session's own next
// message alone: sent once the session's previous message was answered, refused for the slot
// that one holds while it settles (max_in_flight 1), it waits, is admitted, and claims the
// session from the previous message, which its wait read as the session's current run.
func TestSessionsNextMessageThatWaitsForASlotIsServed(t *testing.T) {
	h := oneSlotHarness(t, nil)
	u, key := h.user("standard")
	answered := make(chan struct{})
	var waits atomic.Int32
	firstSettlementHeld(h, answered, func(_ context.Context, step string) {
		if step == "admission waits for a settlement" {
			waits.Add(1)
		}
	})
	sess := map[string]string{proxy.SessionHeader: "s-next-slot"}
	if a := send(h.gw.URL, key, chatBody, sess); a.status != http.StatusOK {
		close(answered)
		t.Fatalf("first message: %d %s", a.status, a.body)
	}
	second := send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"and then?"}]}`, sess)
	close(answered)
	if second.status != http.StatusOK {
		t.Errorf("the session's next message: %d %s; want 200", second.status, second.body)
	}
	if waits.Load() == 0 {
		t.Errorf("the next message never waited for the slot")
	}
	twoCallsSettledInTurn(t, h, u.ID)
}

// TestNewerSessionMessageThatWaitedTakesTheSessionFromAnOlderOne: the wait above must not turn
// the order round. A newer message of a session refused for a slot, waiting, notes the
// session's current run (none) before the older message, admitted on the first settlement,
// claims it; admitted on the next settlement, the newer one found the session claimed since it
// began to wait and was answered 409 superseded, charged nothing, while the older one ran to
// its end. The older one is a message this process serves whose request arrived first: the
// newer one takes the session from it (the older stopped, 409), and runs.
func TestNewerSessionMessageThatWaitedTakesTheSessionFromAnOlderOne(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxInFlight = 2
		c.Plans["standard"] = p
	})
	_, key := h.user("standard")
	gates := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	claimHeld, letClaim := make(chan struct{}), make(chan struct{})
	defer func() {
		for _, g := range []chan struct{}{gates[0], gates[1], letClaim} {
			select {
			case <-g:
			default:
				close(g)
			}
		}
	}()
	var settles, claims, waits atomic.Int32
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		switch step {
		case "settle":
			if n := settles.Add(1); n <= 2 {
				<-gates[n-1]
			}
		case "session claim":
			if claims.Add(1) == 1 {
				close(claimHeld)
				<-letClaim
			}
		case "admission waits for a settlement":
			waits.Add(1)
		}
	})
	for i := range 2 {
		sendOK(t, fmt.Sprintf("call %d", i+1), h.gw.URL, key, chatBody, nil)
	}
	older := make(chan answer, 1)
	go func() {
		older <- send(h.gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: "s-o", "X-Fake-Latency": "3s"})
	}()
	waitFor(t, "the older message to wait for a settlement", func() bool { return waits.Load() == 1 })
	close(gates[0])
	<-claimHeld
	newer := make(chan answer, 1)
	go func() {
		newer <- send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"no, this instead"}]}`,
			map[string]string{proxy.SessionHeader: "s-o"})
	}()
	waitFor(t, "the newer message to wait for a settlement", func() bool { return waits.Load() == 2 })
	calls := h.fake.Calls()
	close(letClaim)
	waitFor(t, "the older message to reach the upstream", func() bool { return h.fake.Calls() > calls })
	close(gates[1])
	o, n := <-older, <-newer
	if n.status != http.StatusOK {
		t.Errorf("the newer message: %d %s; want 200, the session taken from the older one", n.status, n.body)
	}
	if o.status != http.StatusConflict || errorCode(t, o.body) != "superseded" {
		t.Errorf("the older message, replaced by the newer: %d %s; want 409 superseded", o.status, o.body)
	}
}
