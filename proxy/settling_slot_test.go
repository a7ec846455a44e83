package proxy_test

import (
	"bufio"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestSlotOfAnAnsweredCallIsNotRefused: a caller with max_in_flight 1 that sends its next call
// the moment it has the previous answer is served, though that answer's settlement has not
// reached the database yet (held here at its step until the next admission is refused): a
// slot frees when a call ends (README, 429 too_many_in_flight). The admission, refused for
// want of the slot the settling call still held, was answered 429 — about one call in
// fifteen of a sequential caller's — and its SDK waited a second before its retry.
func TestSlotOfAnAnsweredCallIsNotRefused(t *testing.T) {
	h := oneSlotHarness(t, nil)
	u, key := h.user("standard")
	answered := firstCallSettling(t, h, key, nil)
	second := send(h.gw.URL, key, chatBody, nil)
	close(answered)
	if second.status != http.StatusOK {
		t.Errorf("the next call, sent once the first was answered: %d %s; want 200 (its slot freed when the first call ended)",
			second.status, second.body)
	}
	twoCallsSettledInTurn(t, h, u.ID)
}

// twoCallsSettledInTurn wants user's two calls settled complete and charged, never both live
// at once: the second was admitted only after the first was settled (max_in_flight 1).
func twoCallsSettledInTurn(t *testing.T, h *harness, user uint64) {
	t.Helper()
	h.settled()
	runs := h.holdsOf(user)
	if len(runs) != 2 {
		t.Fatalf("%d holds, want the two calls'", len(runs))
	}
	for _, r := range runs {
		if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceComplete || r.ChargedMicro <= 0 {
			t.Errorf("run %s: %s by %q charged %d, want each call settled complete and charged", r.RunID, r.State, r.SettleSource.String, r.ChargedMicro)
		}
	}
	if a, b := runs[0], runs[1]; b.CreatedAt.Before(a.SettledAt.Time) && a.CreatedAt.Before(b.SettledAt.Time) {
		t.Errorf("holds %s [%v, %v] and %s [%v, %v] overlap past max_in_flight 1", a.RunID, a.CreatedAt, a.SettledAt.Time, b.RunID, b.CreatedAt, b.SettledAt.Time)
	}
}

// TestSlotOfACallPastItsFinalEventIsNotRefused: a stream's answer is over for its caller at its
// final event ([DONE]), though the gateway then gives the upstream finalGrace to close. A caller
// with max_in_flight 1 that sends its next call the moment it reads [DONE] is served (README,
// 429 too_many_in_flight: not refused for the call it just finished). The call was counted as
// settling only once its handler ended, after that grace: an admission refused meanwhile found
// nothing of its user's settling and was answered 429 at once.
func TestSlotOfACallPastItsFinalEventIsNotRefused(t *testing.T) {
	h := oneSlotHarness(t, nil)
	u, key := h.user("standard")
	// The upstream keeps its stream open past its last event: the first call ends a moment
	// after its caller has the whole answer.
	first := h.post(key, "/v1/chat/completions", streamBody, map[string]string{fakellm.HeaderChunks: "5", fakellm.HeaderLinger: "1500ms"})
	defer first.Body.Close()
	br := bufio.NewReader(first.Body)
	toDone(t, br)
	second := send(h.gw.URL, key, chatBody, nil)
	if second.status != http.StatusOK {
		t.Errorf("the next call, sent once the first's [DONE] was read: %d %s; want 200 (the first call's answer was over)",
			second.status, second.body)
	}
	readAll(t, br)
	twoCallsSettledInTurn(t, h, u.ID)
}

// TestSlotOfACallInFlightIsRefusedAtOnce: the wait above is for a call whose answer is over.
// A caller past max_in_flight with its calls still running is answered 429 at once, without
// waiting for anything.
func TestSlotOfACallInFlightIsRefusedAtOnce(t *testing.T) {
	refusedAtOnceWhileACallRuns(t, oneSlot(nil), http.StatusTooManyRequests, "too_many_in_flight")
}

// refusedAtOnceWhileACallRuns sends a call while another of its user's runs, on a gateway
// whose config plan adjusts, and checks it is refused status code at once: no wait for a
// settlement, none of the user's calls settling. The first call stays with the upstream until
// the second is answered (gatedHarness): held a fixed 2 s instead, it could end before a slow
// machine's second call was admitted, which then waited for its settlement and was served.
func refusedAtOnceWhileACallRuns(t *testing.T, plan func(*config.Config), status int, code string) {
	t.Helper()
	h, gate := gatedHarness(t, plan)
	_, key := h.user("standard")
	var waits atomic.Int32
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "admission waits for a settlement" {
			waits.Add(1)
		}
	})
	var opened sync.Once
	openFirst := func() { opened.Do(func() { gate.open("first") }) }
	defer openFirst()
	first := make(chan answer, 1)
	go func() { first <- send(h.gw.URL, key, chatBody, map[string]string{"X-Test-Gate": "first"}) }()
	gate.await(t, "first", 1)
	second := send(h.gw.URL, key, chatBody, nil)
	openFirst()
	if second.status != status || errorCode(t, second.body) != code {
		t.Errorf("a call while the first runs: %d %s; want %d %s", second.status, second.body, status, code)
	}
	if n := waits.Load(); n != 0 {
		t.Errorf("the refused admission waited %d times, want none: no call of its user was settling", n)
	}
	if a := <-first; a.status != http.StatusOK {
		t.Errorf("first call: %d %s", a.status, a.body)
	}
	h.settled()
}

// TestSlotWaitPastTheBudgetIsStillTooManyInFlight: an admission that waited for its user's
// settlement and had no budget left to try again (its try not started before admit_timeout:
// nothing held) is answered as its refusal was, 429 too_many_in_flight with Retry-After, not
// 503 billing_unavailable: the database was never out of reach.
func TestSlotWaitPastTheBudgetIsStillTooManyInFlight(t *testing.T) {
	h := oneSlotHarness(t, func(c *config.Config) { c.Limits.AdmitTimeout = 500 * time.Millisecond })
	u, key := h.user("standard")
	var admits atomic.Int32
	answered := firstCallSettling(t, h, key, func(ctx context.Context, step string) {
		if step == "admit" && admits.Add(1) == 3 {
			<-ctx.Done() // the second call's try again: its budget runs out before it starts
		}
	})
	second := send(h.gw.URL, key, chatBody, nil)
	close(answered)
	if n := admits.Load(); n != 3 {
		t.Fatalf("%d admission tries, want 3: the first call's, the second's and its try again after the wait", n)
	}
	if second.status != http.StatusTooManyRequests || errorCode(t, second.body) != "too_many_in_flight" || second.header.Get("Retry-After") == "" {
		t.Errorf("the next call, its try again out of budget: %d Retry-After %q %s; want 429 too_many_in_flight with Retry-After",
			second.status, second.header.Get("Retry-After"), second.body)
	}
	h.settled()
	if runs := h.holdsOf(u.ID); len(runs) != 1 || runs[0].State != holds.StateSettled {
		t.Errorf("holds %+v, want the first call's alone, settled: the refused call held nothing", runs)
	}
}

// oneSlotHarness is a gateway whose standard plan allows one call in flight, with adjust's
// changes.
func oneSlotHarness(t *testing.T, adjust func(*config.Config)) *harness {
	return newHarness(t, oneSlot(adjust))
}

// oneSlot is the config change of oneSlotHarness: the standard plan allows one call in
// flight, then adjust's changes.
func oneSlot(adjust func(*config.Config)) func(*config.Config) {
	return func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxInFlight = 1
		c.Plans["standard"] = p
		if adjust != nil {
			adjust(c)
		}
	}
}

// firstCallSettling sends key's first call, answered 200 while its settlement is held by
// firstSettlementHeld (also as there); the test closes the channel returned once its next
// call is answered.
func firstCallSettling(t *testing.T, h *harness, key string, also func(ctx context.Context, step string)) chan struct{} {
	t.Helper()
	answered := make(chan struct{})
	firstSettlementHeld(h, answered, also)
	sendOK(t, "first call", h.gw.URL, key, chatBody, nil)
	return answered
}

// firstSettlementHeld holds the first settlement at its step until an admission waits for a
// settlement (or, refused outright, until answered closes), and tells also of every step.
func firstSettlementHeld(h *harness, answered <-chan struct{}, also func(ctx context.Context, step string)) {
	waiting := make(chan struct{})
	var waitingOnce sync.Once
	var settles atomic.Int32
	h.srv.ObserveSteps(func(ctx context.Context, step string) {
		switch step {
		case "settle":
			if settles.Add(1) == 1 {
				select {
				case <-waiting:
				case <-answered:
				}
			}
		case "admission waits for a settlement":
			waitingOnce.Do(func() { close(waiting) })
		}
		if also != nil {
			also(ctx, step)
		}
	})
}
