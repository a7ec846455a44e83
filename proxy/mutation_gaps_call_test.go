package proxy_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestNamedRunWhoseBudgetPaysThePromptButNoAnswerIsRunBudgetExhausted: a named run's call
// reserves its part of the run's budget (at least its prompt's cost), then its rewrite fits
// the answer in what was granted. A run whose budget pays the prompt but not one token of
// answer is refused by that rewrite, and the refusal is the run's (402 run_budget_exhausted,
// the run's cap), not a plain call's insufficient_credits: an agent that reads the code
// settles or reopens its run, not its account. The model here prices one output token above
// the whole run's cap, so any reservation granted leaves no room for an answer.
func TestNamedRunWhoseBudgetPaysThePromptButNoAnswerIsRunBudgetExhausted(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		m := c.Models["fake-gpt"]
		m.Output = config.USDPerM{Micro: 1_000_000_000} // 1 000 µUSD an output token
		c.Models["fake-gpt"] = m
		p := c.Plans["standard"]
		// 500 µUSD: the short prompt's few tokens at 2.50 USD/M fit, one answer token does not.
		p.MaxRunCostCredits, p.HoldNormalCredits, p.HoldHeavyCredits = config.Credits{Milli: 500}, config.Credits{Milli: 500}, config.Credits{Milli: 500}
		c.Plans["narrow"] = p
	})
	_, key := h.user("narrow")
	a := send(h.gw.URL, key, chatBody, map[string]string{"X-Run-Id": "narrow-run"})
	if a.status != http.StatusPaymentRequired || errorCode(t, a.body) != "run_budget_exhausted" {
		t.Errorf("named run's call whose run budget pays its prompt but no answer: %d %s; want 402 run_budget_exhausted",
			a.status, a.body)
	}
	h.settled()
}

// TestCallCutWhileItsKeyIsLookedUpAgainIsToldShuttingDown: a call's key is looked up again
// once its body is in (keyStillLive). Cut at the drain deadline while that lookup waits on the
// database, the lookup fails for the cut, not for billing: the caller is answered 503
// shutting_down, nothing charged, as a call cut during its admission is, not 503
// billing_unavailable (Retry shortly), which blamed billing for the gateway's own shutdown.
// The lookup is held by a table lock on api_keys (key_cache_ttl 0: every lookup reads it),
// taken once the first lookup, as the headers arrived, has come back.
func TestCallCutWhileItsKeyIsLookedUpAgainIsToldShuttingDown(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Limits.KeyCacheTTL = 0 })
	_, key := h.user("standard")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := h.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	locked := false
	defer func() {
		if locked {
			_, _ = conn.ExecContext(context.Background(), "UNLOCK TABLES")
		}
	}()
	resp := postWhileKeyStops(t, h, key, nil, func(ctx context.Context) error {
		if _, err := conn.ExecContext(ctx, "LOCK TABLES api_keys WRITE, users WRITE"); err != nil {
			return err
		}
		locked = true
		// The rest of the body goes out once this returns; the cut waits for the lookup.
		go func() {
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				var n int
				err := h.db.Get(&n, `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()
					AND ID <> CONNECTION_ID() AND INFO LIKE '%FROM api_keys%' AND INFO NOT LIKE '%PROCESSLIST%'`)
				if err == nil && n > 0 {
					h.srv.CutCalls()
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Error("the key's second lookup never waited on the locked table")
			h.srv.CutCalls()
		}()
		return nil
	})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if _, err := conn.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
		t.Fatal(err)
	}
	locked = false
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != "shutting_down" || !toldNothingCharged(string(body)) {
		t.Errorf("call cut while its key was looked up again: %d %s; want 503 shutting_down, nothing charged", resp.StatusCode, body)
	}
	if all, _ := h.holdCount(); all != 0 {
		t.Errorf("%d holds taken for a call cut before its admission, want none", all)
	}
}

// TestSessionCallStoppedAtItsFinalEventEndsWithoutASupersededEvent: a newer message of the
// session replaces a streamed call just as the call has read its final event from the
// provider, before it marked its answer whole: the cancel reaches it, but the answer is whole
// and goes out whole. It is charged as complete and its stream ends with the final event: a
// superseded error event after it (the end of a stream cut) told the caller, and an SDK, that
// a whole answer had failed. Held at the step before the answer is marked (final event), the
// newer message's claim lands in that window.
func TestSessionCallStoppedAtItsFinalEventEndsWithoutASupersededEvent(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	atFinal, resume := h.holdAtFirst("final event")
	first := h.post(key, "/v1/chat/completions", streamBody, map[string]string{proxy.SessionHeader: "final-cut"})
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first message: %d", first.StatusCode)
	}
	select {
	case <-atFinal:
	case <-time.After(20 * time.Second):
		t.Fatal("the first message never reached its final event")
	}
	sendOK(t, "the session's next message", h.gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: "final-cut"})
	resume()
	rest := readAll(t, first.Body)
	if bytes.Contains(rest, []byte("superseded")) || !bytes.Contains(rest, []byte("[DONE]")) {
		t.Errorf("a whole answer stopped at its final event ended %q; want its final event, no superseded event", rest)
	}
	h.settled()
	if r := h.run(u.ID, first.Header.Get(proxy.RunIDHeader)); r.SettleSource.String != holds.SourceComplete {
		t.Errorf("first run settled %q, want complete", r.SettleSource.String)
	}
}

// TestSessionCallReplacedRightAfterItsClaimIsReleasedUnforwarded: a newer message of the session
// takes it over just as the older message's claim committed, before the older is forwarded.
// The older one is never forwarded: answered 409 superseded, not to be retried, naming no run,
// its hold released at 0 as a refusal (settle source release), not settled as a call its
// caller cancelled mid-answer. Held at the step after the claim's commit (session claimed).
func TestSessionCallReplacedRightAfterItsClaimIsReleasedUnforwarded(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	claimed, resume := h.holdAtFirst("session claimed")
	first := make(chan answer, 1)
	go func() {
		first <- send(h.gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: "claimed-then-replaced"})
	}()
	select {
	case <-claimed:
	case <-time.After(20 * time.Second):
		t.Fatal("the first message's claim never committed")
	}
	next := sendOK(t, "the session's next message", h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"newer"}]}`,
		map[string]string{proxy.SessionHeader: "claimed-then-replaced"})
	resume()
	a := <-first
	if a.status != http.StatusConflict || errorCode(t, a.body) != "superseded" || a.header.Get("X-Should-Retry") != "false" {
		t.Errorf("older message replaced before its forward: %d %s (X-Should-Retry %q); want 409 superseded, not to be retried",
			a.status, a.body, a.header.Get("X-Should-Retry"))
	}
	if id := a.header.Get(proxy.RunIDHeader); id != "" {
		t.Errorf("older message refused before its forward names run %s", id)
	}
	if n := h.fake.Calls(); n != 1 {
		t.Errorf("%d upstream calls, want the newer message's alone", n)
	}
	h.settled()
	for _, r := range h.holdsOf(u.ID) {
		if r.RunID != next.header.Get(proxy.RunIDHeader) && (r.SettleSource.String != holds.SourceRelease || r.ChargedMicro != 0) {
			t.Errorf("older message's run settled %q at %d µUSD; want released at 0", r.SettleSource.String, r.ChargedMicro)
		}
	}
}

// TestIdemRetryWithOtherBetaHeadersIsTheSameRequest: an Idempotency-Key's record names its
// request by route and body alone, as Stripe's keys do (answerShaping is the fingerprint
// window's, not the key's): a retry that sends the same body under the key with another
// OpenAI-Beta header, or none (an SDK upgraded between the two), is that request, replayed
// from the key's answer and not run again, not refused 422 idempotency_key_reused.
func TestIdemRetryWithOtherBetaHeadersIsTheSameRequest(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	first := sendOK(t, "first attempt", h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: "k-beta", "OpenAI-Beta": "assistants=v2"})
	h.settled()
	retry := send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: "k-beta"})
	if retry.status != http.StatusOK || !bytes.Equal(retry.body, first.body) {
		t.Errorf("retry under the key without the beta header: %d %s; want the first attempt's answer replayed", retry.status, retry.body)
	}
	if n := h.fake.Calls(); n != 1 {
		t.Errorf("%d upstream calls, want the first attempt's alone", n)
	}
}

// TestSessionCallPausedAfterItsClaimWhoseSessionMovedOnIsAnsweredSuperseded: a session's
// message claims its session, then its process is stopped past its hold's life; a peer's
// reconciler charges the hold (reconcile_hold), and the session's next message, finding that
// run settled, takes the session without a cancel. Resumed, the paid call is not forwarded
// (the session's row names the newer message: sessionMovedOn) and is stopped as that cancel
// would have stopped it: answered 409 superseded, not to be retried, rather than 503
// billing_unavailable, whose retry resent the older message over the newer one. The pause is
// stood in for by holding the call at its claim's commit (session claimed) past hold_ttl and
// admit_timeout.
func TestSessionCallPausedAfterItsClaimWhoseSessionMovedOnIsAnsweredSuperseded(t *testing.T) {
	h, holdTTL := pausedHarness(t)
	u, key := h.user("standard")
	runID, _, first, resume := pauseAt(t, h, "session claimed", "its session claim's commit", u.ID, key, chatBody,
		map[string]string{proxy.SessionHeader: "paused-moved-on"}, holdTTL)
	sendOK(t, "the session's next message", h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"newer"}]}`,
		map[string]string{proxy.SessionHeader: "paused-moved-on"})
	resume()
	a := answerWithin(t, first)
	if a.status != http.StatusConflict || errorCode(t, a.body) != "superseded" || a.header.Get("X-Should-Retry") != "false" {
		t.Errorf("paused message whose session moved on: %d %s (X-Should-Retry %q); want 409 superseded, not to be retried",
			a.status, a.body, a.header.Get("X-Should-Retry"))
	}
	if n := h.fake.Calls(); n != 1 {
		t.Errorf("%d upstream calls, want the newer message's alone (run %s paused)", n, runID)
	}
	h.settled()
}

// TestSessionCallPausedAfterItsClaimWhoseSessionRowWasPrunedIsForwarded: a session's message
// claims its session, then its process is stopped past its hold's life; a peer's reconciler
// charges the hold (reconcile_hold), and the session's row, idle and naming a settled run, is
// pruned (PruneSessions). Resumed, the paid call finds no row: no newer message took the
// session (sessionMovedOn), and it is forwarded, the call its caller paid for, not answered
// 409 superseded by a message that never came. The pause is stood in for by holding the call
// at its claim's commit (session claimed) past hold_ttl and admit_timeout.
func TestSessionCallPausedAfterItsClaimWhoseSessionRowWasPrunedIsForwarded(t *testing.T) {
	h, holdTTL := pausedHarness(t)
	u, key := h.user("standard")
	runID, _, first, resume := pauseAt(t, h, "session claimed", "its session claim's commit", u.ID, key, chatBody,
		map[string]string{proxy.SessionHeader: "paused-pruned"}, holdTTL)
	if n, err := h.store.PruneSessions(context.Background(), time.Second, 100); err != nil || n != 1 {
		t.Fatalf("prune of the paused message's session row: %d %v; want it pruned", n, err)
	}
	calls := h.fake.Calls()
	resume()
	a := answerWithin(t, first)
	h.settled()
	forwardedAsPaid(t, h, a, runID, calls, "paused message whose session row was pruned")
}
