package proxy_test

import (
	"net/http"
	"testing"
)

// TestCountTokensWrongKeyIsCounted: the token counter is one of the routes
// tollgate_requests_total is labelled with, and a count refused before its caller is known (a
// wrong key) is counted there as its other refusals are: Claude Code asks it at every turn, so
// a client left with a revoked key shows as a stream of 401s on it.
func TestCountTokensWrongKeyIsCounted(t *testing.T) {
	h := newHarness(t, nil)
	resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"X-Api-Key": "sk-not-a-key"})
	readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("count with a wrong key: %d, want 401", resp.StatusCode)
	}
	if got := h.metric(`tollgate_requests_total{code="401",route="/v1/messages/count_tokens"}`); got != "1" {
		t.Errorf("wrong-key counts counted %q, want 1", got)
	}
}
