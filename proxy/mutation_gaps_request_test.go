package proxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestNamedRunCallWithoutABoundReservesForEachOfItsChoices: a named run's call that sets no
// output bound reserves the worst case of all its answers at the model's configured limit (n
// of them), not of one: reserved for one, the rewrite fitted the call to the reservation by
// adding a bound of 1/n of the model's limit, and a run with budget to spare cut every answer
// short of what the model may write.
func TestNamedRunCallWithoutABoundReservesForEachOfItsChoices(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		m := c.Models["fake-gpt"]
		m.MaxOutputTokens = 1_000
		c.Models["fake-gpt"] = m
	})
	_, key := h.user("standard")
	// Default cap 500 000 µUSD; fake-gpt output is 10 µUSD a token: 4 answers of the model's
	// 1 000 tokens (40 000 µUSD) fit many times over.
	body := `{"model":"fake-gpt","n":4,"messages":[{"role":"user","content":"four ways"}]}`
	h.postOK(t, key, "/v1/chat/completions", body, map[string]string{"X-Run-Id": "task-unbounded-choices"})
	sent := up.last(t)
	for _, f := range []string{"max_tokens", "max_completion_tokens"} {
		if v := sent.Get(f); v.Exists() {
			t.Errorf("upstream got %s=%s for a call of n=4 in a run with budget for 4 answers at the model's limit: want no bound added", f, v.Raw)
		}
	}
	if status, b := h.settleRun(key, "task-unbounded-choices"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, b)
	}
}

// TestNamedRunCallWithAHugeBoundOfSeveralAnswersIsServed: the worst case a named run's call
// reserves, n answers each up to max_tokens, is clamped before it is multiplied: a bound of
// 2^62 tokens times n=4 wraps an int64 to 0, a reservation of the prompt alone, and a call the
// run's budget pays for (its bound lowered to what the budget pays) was refused 402.
func TestNamedRunCallWithAHugeBoundOfSeveralAnswersIsServed(t *testing.T) {
	h, up := jsonHarness(t)
	_, key := h.user("standard")
	body := `{"model":"fake-gpt","n":4,"max_tokens":4611686018427387904,"messages":[{"role":"user","content":"four ways"}]}`
	h.postOK(t, key, "/v1/chat/completions", body, map[string]string{"X-Run-Id": "task-huge-bound"}) // want it served with its bound lowered to what the run's budget pays for
	// Default cap 500 000 µUSD at 10 µUSD an output token: at most 50 000 tokens for 4 answers.
	if got := up.last(t).Get("max_tokens").Int(); got < 1 || got > 12_500 {
		t.Errorf("upstream got max_tokens=%d, want it lowered to a quarter of what the cap pays for", got)
	}
	if status, b := h.settleRun(key, "task-huge-bound"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, b)
	}
}

// TestBodyOfExactlyTheLimitIsServed: limits.max_body_bytes is the largest body served: a body
// of exactly that many bytes is read and answered, and one a byte larger is refused 413
// request_too_large, before anything is held or forwarded.
func TestBodyOfExactlyTheLimitIsServed(t *testing.T) {
	const limit = 4096
	h := newHarness(t, func(c *configT) { c.Limits.MaxBodyBytes = limit })
	_, key := h.user("standard")
	body := func(size int) string {
		head, tail := `{"model":"fake-gpt","messages":[{"role":"user","content":"`, `"}]}`
		return head + strings.Repeat("x", size-len(head)-len(tail)) + tail
	}
	h.postOK(t, key, "/v1/chat/completions", body(limit), nil) // a body of exactly max_body_bytes
	h.postRefused(t, key, "/v1/chat/completions", body(limit+1), nil, http.StatusRequestEntityTooLarge, "request_too_large")
}
