package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestUpstreamPaymentRefusalIsNotTheCallersBalance: a provider's 402 (DeepSeek's "Insufficient
// Balance", OpenRouter's "Insufficient credits") refuses to bill the operator's account there,
// which the caller can do nothing about, as its 401 refuses the gateway's key. Passed on as the
// 402 it is, it read as the gateway's own 402 insufficient_credits: the caller was told, in the
// status the HTTP surface keeps for its own balance, that it could not pay. It is a 502 the
// caller is told not to retry (a retry is refused the same way until the operator pays),
// charged nothing, and the caller's own 402 stays the gateway's.
func TestUpstreamPaymentRefusalIsNotTheCallersBalance(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		body := chatBody
		if path == "/v1/messages" {
			body = `{"model":"claude-test","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
		}
		resp := h.post(key, path, body, map[string]string{fakellm.HeaderStatus: "402"})
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Should-Retry") != "false" {
			t.Errorf("%s: upstream 402 answered %d (X-Should-Retry %q) %s; want 502, not to be retried",
				path, resp.StatusCode, resp.Header.Get("X-Should-Retry"), answer)
		}
		if path == "/v1/chat/completions" && resp.StatusCode == http.StatusBadGateway && errorCode(t, answer) != "upstream_error" {
			t.Errorf("%s: code %s, want upstream_error", path, errorCode(t, answer))
		}
		if r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); r.ChargedMicro != 0 || r.SettleSource.String != "upstream_error" {
			t.Errorf("%s: settled by %q at %d, want upstream_error at 0", path, r.SettleSource.String, r.ChargedMicro)
		}
	}
}
