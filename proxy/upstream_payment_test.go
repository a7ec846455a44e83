package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
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

// TestUpstreamQuotaRefusalIsNotARateLimit: OpenAI answers an account out of credit 429 with
// the code insufficient_quota. Passed on as the 429 it is, it read as a rate limit: SDKs
// retried it with backoff, each retry refused the same way, and the caller was never told that
// no wait would help. It is the operator's account, as a 402 is: 502 not to be retried, charged
// nothing. A 429 that is a rate limit still passes as sent, for the caller to back off.
func TestUpstreamQuotaRefusalIsNotARateLimit(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"You exceeded your current quota.","type":"`+r.Header.Get("X-Test-Type")+
			`","param":null,"code":"`+r.Header.Get("X-Test-Code")+`"}}`)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "quota", Kind: "openai", BaseURL: up.URL, Models: []string{"*"}}}
	})
	u, key := h.user("standard")
	for _, tc := range []struct {
		name, typ, code string
		status          int
		wantCode        string
	}{
		{"quota as code and type", "insufficient_quota", "insufficient_quota", http.StatusBadGateway, "upstream_error"},
		{"quota as type", "insufficient_quota", "", http.StatusBadGateway, "upstream_error"},
		{"rate limit", "requests", "rate_limit_exceeded", http.StatusTooManyRequests, "rate_limit_exceeded"},
	} {
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Test-Type": tc.typ, "X-Test-Code": tc.code})
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || errorCode(t, answer) != tc.wantCode {
			t.Errorf("%s: %d %s, want %d %s", tc.name, resp.StatusCode, answer, tc.status, tc.wantCode)
		}
		if retry := resp.Header.Get("X-Should-Retry"); (tc.status == http.StatusBadGateway) != (retry == "false") {
			t.Errorf("%s: X-Should-Retry %q", tc.name, retry)
		}
		if r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); r.ChargedMicro != 0 || r.SettleSource.String != "upstream_error" {
			t.Errorf("%s: settled by %q at %d, want upstream_error at 0", tc.name, r.SettleSource.String, r.ChargedMicro)
		}
	}
}

// TestAnthropicCreditBalanceRefusalIsNotTheCallersBalance: Anthropic refuses to bill an
// account out of credit with 400 invalid_request_error, "Your credit balance is too low to
// access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits." (also
// on its free token counter). Passed on as the caller's own mistake, it told every caller of
// /v1/messages that its credit balance was too low — the gateway's balance, in words — when it
// was the operator's account at Anthropic, as a 402 or OpenAI's insufficient_quota is. It is
// a 502 the caller is told not to retry, charged nothing; a 400 that is the caller's mistake
// still passes as sent.
func TestAnthropicCreditBalanceRefusalIsNotTheCallersBalance(t *testing.T) {
	const noCredit = `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."},"request_id":"req_011CbrFTcXhtiMzr3s6EocF7"}`
	const mistake = `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Input should be greater than or equal to 1"}}`
	// A caller's mistake whose message quotes the caller's own words, here the refusal's: only
	// a message that begins with it is the operator's account.
	const quoted = `{"type":"error","error":{"type":"invalid_request_error","message":"metadata.user_id: 'Your credit balance is too low' is not a valid user id"}}`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		switch r.Header.Get("X-Test-Mistake") {
		case "":
			_, _ = io.WriteString(w, noCredit)
		case "quoted":
			_, _ = io.WriteString(w, quoted)
		default:
			_, _ = io.WriteString(w, mistake)
		}
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "anthropic", Kind: "anthropic", BaseURL: up.URL, Models: []string{"*"}}}
	})
	u, key := h.user("standard")
	const msgBody = `{"model":"claude-test","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, path string
		hdr        map[string]string
		status     int
		want       string
	}{
		{"message", "/v1/messages", nil, http.StatusBadGateway, ""},
		{"token count", "/v1/messages/count_tokens", nil, http.StatusBadGateway, ""},
		{"the caller's mistake", "/v1/messages", map[string]string{"X-Test-Mistake": "1"}, http.StatusBadRequest, mistake},
		{"the caller's mistake quoting the refusal", "/v1/messages", map[string]string{"X-Test-Mistake": "quoted"}, http.StatusBadRequest, quoted},
	} {
		resp := h.post(key, tc.path, msgBody, tc.hdr)
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, resp.StatusCode, answer, tc.status)
			continue
		}
		if tc.status == http.StatusBadGateway {
			if resp.Header.Get("X-Should-Retry") != "false" || strings.Contains(string(answer), "credit balance") {
				t.Errorf("%s: X-Should-Retry %q, %s: want 502 in the gateway's words, not to be retried",
					tc.name, resp.Header.Get("X-Should-Retry"), answer)
			}
		} else if string(answer) != tc.want {
			t.Errorf("%s: %s, want the upstream's answer as sent", tc.name, answer)
		}
		if tc.path == "/v1/messages" {
			if r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); r.ChargedMicro != 0 || r.SettleSource.String != "upstream_error" {
				t.Errorf("%s: settled by %q at %d, want upstream_error at 0", tc.name, r.SettleSource.String, r.ChargedMicro)
			}
		}
	}
}
