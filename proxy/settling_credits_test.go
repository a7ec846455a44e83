package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestCreditsHeldByAnAnsweredCallDoNotRefuseTheNext: a caller whose balance the hold of one
// call takes whole (less than the plan's hold tier left) and that sends its next call the
// moment it has the previous answer is served, though that answer's settlement has not reached
// the database yet (held here at its step until the next admission waits for it): what a call
// holds is given back when the call ends, as its slot is (README, 402 insufficient_credits).
// The admission found the answered call's hold still live, nothing available, and was refused
// 402 "used or held by calls in flight" — no call of the caller's was in flight — which no SDK
// retries: one of twenty calls an OpenAI Go client sent in turn, at the end of its balance.
func TestCreditsHeldByAnAnsweredCallDoNotRefuseTheNext(t *testing.T) {
	h := lowBalanceHarness(t)
	u, key := h.user("standard")
	answered := make(chan struct{})
	firstSettlementHeld(h, answered, nil)
	if a := send(h.gw.URL, key, chatBody, nil); a.status != http.StatusOK {
		t.Fatalf("first call: %d %s", a.status, a.body)
	}
	second := send(h.gw.URL, key, chatBody, nil)
	close(answered)
	if second.status != http.StatusOK {
		t.Errorf("the next call, sent once the first was answered: %d %s; want 200 (what the first held was given back when it ended)",
			second.status, second.body)
	}
	twoCallsSettledInTurn(t, h, u.ID)
}

// TestCreditsHeldByACallInFlightRefuseAtOnce: the wait above is for a call whose answer is
// over. A caller whose credits a running call holds is answered 402 at once, without waiting.
func TestCreditsHeldByACallInFlightRefuseAtOnce(t *testing.T) {
	h := lowBalanceHarness(t)
	_, key := h.user("standard")
	var waits atomic.Int32
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "admission waits for a settlement" {
			waits.Add(1)
		}
	})
	calls := h.fake.Calls()
	first := make(chan answer, 1)
	go func() { first <- send(h.gw.URL, key, chatBody, map[string]string{"X-Fake-Latency": "2s"}) }()
	waitFor(t, "the first call to reach the upstream", func() bool { return h.fake.Calls() > calls })
	second := send(h.gw.URL, key, chatBody, nil)
	if second.status != http.StatusPaymentRequired || errorCode(t, second.body) != "insufficient_credits" {
		t.Errorf("a call while the first holds every credit: %d %s; want 402 insufficient_credits", second.status, second.body)
	}
	if n := waits.Load(); n != 0 {
		t.Errorf("the refused admission waited %d times, want none: no call of its user was settling", n)
	}
	if a := <-first; a.status != http.StatusOK {
		t.Errorf("first call: %d %s", a.status, a.body)
	}
	h.settled()
}

// lowBalanceHarness is a gateway whose standard plan's allowance (10 credits) is below its
// hold tier (20): one call's hold takes all that is available.
func lowBalanceHarness(t *testing.T) *harness {
	return newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.AllowanceCredits = config.CreditsOf(10)
		c.Plans["standard"] = p
	})
}
