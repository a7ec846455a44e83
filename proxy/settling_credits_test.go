package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
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
	answered := firstCallSettling(t, h, key, nil)
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
	refusedAtOnceWhileACallRuns(t, lowBalance, http.StatusPaymentRequired, "insufficient_credits")
}

// aLittleOverTheTier gives the standard plan an allowance a little over its hold tier (20.5
// credits, tier 20): a call's hold while another settles is granted what is left, too little
// for a long prompt.
func aLittleOverTheTier(c *config.Config) {
	p := c.Plans["standard"]
	p.AllowanceCredits = config.Credits{Milli: 20_500}
	c.Plans["standard"] = p
}

// lowBalanceHarness is a gateway whose standard plan's allowance (10 credits) is below its
// hold tier (20): one call's hold takes all that is available.
func lowBalanceHarness(t *testing.T) *harness {
	return newHarness(t, lowBalance)
}

// lowBalance is the config change of lowBalanceHarness.
func lowBalance(c *config.Config) {
	p := c.Plans["standard"]
	p.AllowanceCredits = config.CreditsOf(10)
	c.Plans["standard"] = p
}

// TestLongPromptAfterAnAnsweredCallIsNotRefusedForTheCapItsHoldLeft: a caller with a little
// more than the plan's hold tier left (20.5 credits, tier 20) that sends a long prompt the
// moment it has the previous answer is served, though that answer's settlement has not
// reached the database yet (held here at its step until the next admission waits for it).
// The admission was granted, but only what the settling hold left (0.5 credits), which does
// not pay for the prompt: it was refused 402 "This prompt and the least answer cost more…",
// and the same call sent again a moment later was 200. Released at 0, it is admitted again
// once the settlement lands (README, 402 insufficient_credits).
func TestLongPromptAfterAnAnsweredCallIsNotRefusedForTheCapItsHoldLeft(t *testing.T) {
	h := newHarness(t, aLittleOverTheTier)
	u, key := h.user("standard")
	answered := firstCallSettling(t, h, key, nil)
	second := send(h.gw.URL, key, longPromptBody(3000), nil)
	close(answered)
	if second.status != http.StatusOK {
		t.Errorf("a long prompt sent once the first call was answered: %d %s; want 200 (what the first held was given back when it ended)",
			second.status, second.body)
	}
	h.settled()
	var complete, released int
	for _, r := range h.holdsOf(u.ID) {
		switch {
		case r.State != holds.StateSettled:
			t.Errorf("run %s left %s", r.RunID, r.State)
		case r.SettleSource.String == holds.SourceComplete && r.ChargedMicro > 0:
			complete++
		case r.SettleSource.String == holds.SourceRelease && r.ChargedMicro == 0:
			released++
		default:
			t.Errorf("run %s settled by %q charged %d", r.RunID, r.SettleSource.String, r.ChargedMicro)
		}
	}
	if complete != 2 || released != 1 {
		t.Errorf("%d calls settled complete and %d holds released at 0; want both calls charged, and the small hold released",
			complete, released)
	}
}

// TestNamedRunsLongPromptIsNotReleasedToWaitForASettlement: the wait above is a fresh call's
// alone (README, 402 insufficient_credits). A named run's hold is its run's, which other calls
// of it may run on and whose id its agent settles by: released at 0 and admitted again under a
// new run id, the run was settled as released and its call charged to a run its agent cannot
// name. Its long prompt, the hold too small while the previous call settles, is refused 402
// run_budget_exhausted (the run's cap is its hold's) at once, and the run keeps its one hold.
func TestNamedRunsLongPromptIsNotReleasedToWaitForASettlement(t *testing.T) {
	h := newHarness(t, aLittleOverTheTier)
	u, key := h.user("standard")
	answered := firstCallSettling(t, h, key, nil)
	second := send(h.gw.URL, key, longPromptBody(3000), map[string]string{"X-Run-Id": "task-long"})
	close(answered)
	if second.status != http.StatusPaymentRequired || errorCode(t, second.body) != "run_budget_exhausted" {
		t.Errorf("a named run's long prompt while the previous call settles: %d %s; want 402 run_budget_exhausted (its hold's cap)",
			second.status, second.body)
	}
	h.settled()
	var named []holds.Run
	for _, r := range h.holdsOf(u.ID) {
		if r.ClientRunID.String == "task-long" {
			named = append(named, r)
		}
	}
	if len(named) != 1 || named[0].SettleSource.String == holds.SourceRelease {
		for _, r := range named {
			t.Logf("run %s of task-long: %s %q charged %d", r.RunID, r.State, r.SettleSource.String, r.ChargedMicro)
		}
		t.Errorf("task-long has %d holds; want its one, not released to wait for a settlement", len(named))
	}
}

// TestLongPromptWaitPastTheBudgetIsStillRefusedForItsPrompt: a call whose small hold was
// released to wait for its user's settlement, and that had no budget left to be admitted again
// (its try not started before admit_timeout: nothing held), is answered as the small hold was,
// 402 for its prompt, not 503 billing_unavailable, with nothing left held.
func TestLongPromptWaitPastTheBudgetIsStillRefusedForItsPrompt(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		aLittleOverTheTier(c)
		c.Limits.AdmitTimeout = 500 * time.Millisecond
	})
	u, key := h.user("standard")
	var admits atomic.Int32
	answered := firstCallSettling(t, h, key, func(ctx context.Context, step string) {
		if step == "admit" && admits.Add(1) == 3 {
			<-ctx.Done() // the second call's admission again: its budget runs out before it starts
		}
	})
	second := send(h.gw.URL, key, longPromptBody(3000), nil)
	close(answered)
	if n := admits.Load(); n != 3 {
		t.Fatalf("%d admission tries, want 3: the first call's, the second's and its admission again after the wait", n)
	}
	if second.status != http.StatusPaymentRequired || errorCode(t, second.body) != "insufficient_credits" ||
		!strings.Contains(string(second.body), "This prompt") {
		t.Errorf("the long prompt, its admission again out of budget: %d %s; want 402 insufficient_credits for its prompt",
			second.status, second.body)
	}
	h.settled()
	runs := h.holdsOf(u.ID)
	if len(runs) != 2 {
		t.Fatalf("%d holds, want the first call's and the released small one", len(runs))
	}
	chargedOrReleased(t, runs, "the first call charged, the small hold released at 0")
}

// TestLongPromptOverTheCapWithNothingSettlingIsRefusedAtOnce: the wait above is for a settling
// call. A prompt that what is available does not pay for, with nothing of its user's settling,
// is refused 402 at once, without waiting.
func TestLongPromptOverTheCapWithNothingSettlingIsRefusedAtOnce(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.AllowanceCredits = config.Credits{Milli: 500}
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	var waits atomic.Int32
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "admission waits for a settlement" {
			waits.Add(1)
		}
	})
	a := send(h.gw.URL, key, longPromptBody(3000), nil)
	if a.status != http.StatusPaymentRequired || errorCode(t, a.body) != "insufficient_credits" {
		t.Errorf("a long prompt over what is available: %d %s; want 402 insufficient_credits", a.status, a.body)
	}
	if n := waits.Load(); n != 0 {
		t.Errorf("the refused call waited %d times, want none: no call of its user was settling", n)
	}
	h.settled()
	if runs := h.holdsOf(u.ID); len(runs) != 1 || runs[0].SettleSource.String != holds.SourceRelease || runs[0].ChargedMicro != 0 {
		t.Errorf("holds %+v, want the one refused call's, released at 0", runs)
	}
}

// TestPromptOverThePlansCapWhileACallSettlesIsRefusedAfterOneWait: a prompt that the plan's
// max_run_cost_credits does not pay for is refused 402 for its prompt whatever settles: its
// hold, released to wait for its user's settlement, is admitted again once, with the same cap,
// and refused, not released and admitted again while settlements keep ending. Nothing is
// charged for it.
func TestPromptOverThePlansCapWhileACallSettlesIsRefusedAfterOneWait(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxRunCostCredits = p.HoldHeavyCredits
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	var waits atomic.Int32
	answered := firstCallSettling(t, h, key, func(_ context.Context, step string) {
		if step == "admission waits for a settlement" {
			waits.Add(1)
		}
	})
	second := send(h.gw.URL, key, longPromptBody(25_000), nil)
	close(answered)
	if second.status != http.StatusPaymentRequired || !strings.Contains(string(second.body), "This prompt") {
		t.Errorf("a prompt over the plan's cap: %d %s; want 402 insufficient_credits for its prompt", second.status, second.body)
	}
	if n := waits.Load(); n != 1 {
		t.Errorf("the call waited %d times for a settlement, want once", n)
	}
	h.settled()
	chargedOrReleased(t, h.holdsOf(u.ID), "the first call charged, the refused call's holds released at 0")
}

// TestPromptOverThePlansCapIsRefusedAfterOneWaitWhileMoreCallsSettle: as above, with another of
// its user's calls still settling after the first settlement landed: the prompt is refused
// once that settlement did not raise its cap (README, 402 insufficient_credits: "a prompt over
// the plan's max_run_cost_credits waits once"), not released and admitted again after the next.
func TestPromptOverThePlansCapIsRefusedAfterOneWaitWhileMoreCallsSettle(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxRunCostCredits = p.HoldHeavyCredits
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	// The two answered calls' settlements are held, one landing at each wait.
	waits, letAll := settlementsLandInTurn(h, 2)
	defer letAll()
	for i := range 2 {
		sendOK(t, fmt.Sprintf("call %d", i+1), h.gw.URL, key, chatBody, nil)
	}
	waitFor(t, "both answered calls counted as settling", func() bool { return h.srv.SettlingCalls(u.ID) == 2 })
	long := send(h.gw.URL, key, longPromptBody(25_000), nil)
	if long.status != http.StatusPaymentRequired || !strings.Contains(string(long.body), "This prompt") {
		t.Errorf("a prompt over the plan's cap while two calls settle: %d %s; want 402 insufficient_credits for its prompt",
			long.status, long.body)
	}
	if n := waits.Load(); n != 1 {
		t.Errorf("the call waited %d times for a settlement, want once: the first did not raise its cap", n)
	}
	letAll()
	h.settled()
	runs := h.holdsOf(u.ID)
	if len(runs) != 4 {
		t.Errorf("%d holds, want the two answered calls' and the prompt's two (before and after its one wait)", len(runs))
	}
	chargedOrReleased(t, runs, "the answered calls charged, the prompt's holds released at 0")
}

// longPromptBody is a chat call whose prompt is words words long.
func longPromptBody(words int) string {
	return `{"model":"fake-gpt","messages":[{"role":"user","content":"` + strings.Repeat("word ", words) + `"}]}`
}
