package proxy_test

import (
	"net/http"
	"testing"
)

// TestNamedRunCallReservesForEachOfItsChoices: a named run's call reserves the worst case of
// all its answers (n of them, each up to max_tokens), not of one: reserved for one, the
// rewrite fitted the call to the reservation by lowering max_tokens to a share of it, and a
// run with budget to spare cut every answer of an n>1 call to 1/n of what its caller asked.
func TestNamedRunCallReservesForEachOfItsChoices(t *testing.T) {
	h, up := jsonHarness(t)
	_, key := h.user("standard")
	// Default cap 500 000 µUSD; fake-gpt output is 10 µUSD a token: 4 answers of 100 tokens
	// (4 000 µUSD) fit many times over.
	body := `{"model":"fake-gpt","n":4,"max_tokens":100,"messages":[{"role":"user","content":"four ways"}]}`
	h.postOK(t, key, "/v1/chat/completions", body, map[string]string{"X-Run-Id": "task-choices"})
	if got := up.last(t).Get("max_tokens").Int(); got != 100 {
		t.Errorf("upstream got max_tokens=%d for a call of n=4 asking 100 in a run with budget to spare: want 100 untouched", got)
	}
	if status, b := h.settleRun(key, "task-choices"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, b)
	}
}
