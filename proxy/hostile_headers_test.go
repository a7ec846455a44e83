package proxy_test

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// recordingUpstream answers every call with a small completion and keeps the headers it was sent.
func recordingUpstream(extra http.Header) (http.HandlerFunc, func() http.Header) {
	var mu sync.Mutex
	var got http.Header
	return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			mu.Lock()
			got = r.Header.Clone()
			mu.Unlock()
			for k, vv := range extra {
				w.Header()[k] = vv
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, plainAnswer)
		}, func() http.Header {
			mu.Lock()
			defer mu.Unlock()
			return got
		}
}

// postedHeaders sends a chat call with hdr, which must be answered 200, and returns the headers
// the upstream (seen, a recordingUpstream's) was sent.
func postedHeaders(h *harness, key string, hdr map[string]string, seen func() http.Header) http.Header {
	h.t.Helper()
	h.postOK(h.t, key, "/v1/chat/completions", chatBody, hdr)
	return seen()
}

// checkNotForwarded fails t for each header of hdr that got carries.
func checkNotForwarded(t *testing.T, got http.Header, hdr map[string]string, what string) {
	t.Helper()
	for k := range hdr {
		if v := got.Values(k); len(v) > 0 {
			t.Errorf("%s %s reached the upstream: %q", what, k, v)
		}
	}
}

// A caller's headers that speak for the client's identity or carry credentials in another
// provider's spelling must not reach the upstream next to the operator's key: X-Forwarded-For
// and Forwarded are dropped, their siblings must be too, and Azure's api-key is a credential.
func TestCallerIdentityHeadersNotForwarded(t *testing.T) {
	up, seen := recordingUpstream(nil)
	h := hostileHarness(t, up, func(c *config.Config) { c.Upstreams[0].APIKey = "sk-operator" })
	_, key := h.user("standard")
	spoof := map[string]string{
		"X-Forwarded-Host":    "internal.admin.example",
		"X-Forwarded-Proto":   "https",
		"X-Forwarded-Port":    "443",
		"X-Real-Ip":           "10.0.0.1",
		"True-Client-Ip":      "10.0.0.1",
		"Api-Key":             "caller-own-azure-key",
		"X-Api-Key":           "caller-xapikey",
		"Openai-Organization": "org-caller",
		"X-Forwarded-For":     "10.0.0.1",
		"X_Api_Key":           "caller-underscore", // CGI-style servers read it as X-Api-Key
		// Claims of another URL or method, which proxies in front of an upstream honour.
		"X-Original-Uri":         "/v1/chat/completions",
		"X-Forwarded-Uri":        "/v1/chat/completions",
		"X-Envoy-Original-Path":  "/v1/chat/completions",
		"X-Http-Method-Override": "GET",
		"X-Method-Override":      "GET",
		"X-Http-Method":          "GET",
		// Every X-Forwarded-* sibling, not a list of them: nginx ingress's scheme, ssl and
		// path, Envoy's client certificate, which vouches for the client to whatever in front
		// of the upstream trusts it.
		"X-Forwarded-Scheme":      "https",
		"X-Forwarded-Ssl":         "on",
		"X-Forwarded-Path":        "/v1/messages/count_tokens",
		"X-Forwarded-Url":         "https://internal.admin.example/v1/messages/count_tokens",
		"X-Forwarded-Client-Cert": "By=spiffe://operator/gateway;URI=spiffe://operator/admin",
		"X-Forwarded-User":        "admin",
	}
	got := postedHeaders(h, key, spoof, seen)
	if a := got.Get("Authorization"); a != "Bearer sk-operator" {
		t.Errorf("upstream Authorization %q, want the operator's key", a)
	}
	checkNotForwarded(t, got, spoof, "caller header")
}

// The upstream's account identifiers (OpenAI's organisation and project, Anthropic's
// organisation id) and its rate-limit state (what the operator's account has left, which
// every caller's traffic spends) describe the operator's provider account, not the caller's
// answer; HSTS and Alt-Svc describe the provider's host, not the gateway's.
func TestOperatorAccountHeadersNotRelayed(t *testing.T) {
	up, _ := recordingUpstream(http.Header{
		"Openai-Organization":                        {"org-operator-secret-id"},
		"Openai-Project":                             {"proj_operator"},
		"Anthropic-Organization-Id":                  {"11111111-2222-3333-4444-555555555555"},
		"X-Ratelimit-Remaining-Requests":             {"9"},
		"X-Ratelimit-Reset-Tokens":                   {"6m0s"},
		"Anthropic-Ratelimit-Unified-5h-Utilization": {"0.93"},
		"Anthropic-Ratelimit-Input-Tokens-Remaining": {"1200"},
		"Strict-Transport-Security":                  {"max-age=31536000; includeSubDomains; preload"},
		"Alt-Svc":                                    {`h3=":443"; ma=86400`},
	})
	h := hostileHarness(t, up, func(c *config.Config) { c.Upstreams[0].APIKey = "sk-operator" })
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	_ = readAll(t, resp.Body)
	resp.Body.Close()
	for _, k := range []string{"Openai-Organization", "Openai-Project", "Anthropic-Organization-Id",
		"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Tokens", "Anthropic-Ratelimit-Unified-5h-Utilization",
		"Anthropic-Ratelimit-Input-Tokens-Remaining", "Strict-Transport-Security", "Alt-Svc"} {
		if v := resp.Header.Values(k); len(v) > 0 {
			t.Errorf("operator's upstream account header %s reached the caller: %q", k, v)
		}
	}
}

// TestCallerIdempotencyHeaderDoesNotMakeTheUpstreamCallResent: Go's transport resends a
// request marked idempotent (an Idempotency-Key or X-Idempotency-Key header) whose reused
// connection broke after it was written — a provider that had read it may run it twice,
// while the gateway charges once. A caller's X-Idempotency-Key passed through did that; the
// gateway's own Idempotency-Key, which it drops, never could.
func TestCallerIdempotencyHeaderDoesNotMakeTheUpstreamCallResent(t *testing.T) {
	var calls atomic.Int32
	up := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if calls.Add(1) == 2 {
			// The second call, on the first one's connection: read whole, then the
			// connection goes away without an answer.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, plainAnswer)
	}
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil) // leaves its connection in the pool
	readAll(t, resp.Body)
	resp.Body.Close()
	resp = h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"once"}]}`,
		map[string]string{"X-Idempotency-Key": "caller-key-1"})
	readAll(t, resp.Body)
	resp.Body.Close()
	if n := calls.Load(); n != 2 {
		t.Fatalf("the upstream was sent the second call %d times, want once", n-1)
	}
}

// TestOperatorAccountNotNamedInRelayedErrors: OpenAI words its rate-limit refusals with the
// operator's organisation (and project) id — "Rate limit reached for gpt-4o in organization
// org-… on tokens per min" — which the gateway keeps from its callers in headers
// (TestOperatorAccountHeadersNotRelayed). A 4xx passed through must not name them either.
func TestOperatorAccountNotNamedInRelayedErrors(t *testing.T) {
	const org, proj = "org-AbCdEf0123456789ghIJklMN", "proj_Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2"
	up := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"Rate limit reached for fake-gpt in organization `+org+` (project `+proj+
			`) on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`)
	}
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d: %s, want the upstream's 429", resp.StatusCode, body)
	}
	if strings.Contains(string(body), org) || strings.Contains(string(body), proj) {
		t.Errorf("the relayed error names the operator's account: %s", body)
	}
	if code := errorCode(t, body); code != "rate_limit_exceeded" {
		t.Errorf("code %q, want the upstream's rate_limit_exceeded", code)
	}
	if n, err := strconv.Atoi(resp.Header.Get("Content-Length")); err != nil || n != len(body) {
		t.Errorf("Content-Length %q for a body of %d bytes", resp.Header.Get("Content-Length"), len(body))
	}
}

// TestEncodedUpstreamErrorIsWordedByTheGateway: an upstream 4xx in a Content-Encoding the
// gateway did not ask for (a CDN's deflate or br) was relayed as it came, bytes and header:
// the gateway could not read it, so the operator's organisation id in a rate-limit refusal
// reached the caller inside it, unredacted, and a client without that decoder got bytes it
// could not parse. It keeps its status and retry advice, worded by the gateway.
func TestEncodedUpstreamErrorIsWordedByTheGateway(t *testing.T) {
	const org = "org-AbCdEf0123456789ghIJklMN"
	var packed bytes.Buffer
	fw, err := flate.NewWriter(&packed, flate.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(fw, `{"error":{"message":"Rate limit reached for fake-gpt in organization `+org+`.","type":"tokens","code":"rate_limit_exceeded"}}`)
	fw.Close()
	up := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "deflate")
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write(packed.Bytes())
	}
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("status %d, Retry-After %q: want the upstream's 429 and its advice", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" {
		t.Errorf("relayed with Content-Encoding %q: the gateway could not read what it passed on", enc)
	}
	if code := errorCode(t, body); code != "upstream_refused" {
		t.Errorf("code %q, want upstream_refused (the gateway's words)", code)
	}
}

// TestAnthropicOrganizationNotNamedInRelayedErrors: Anthropic words its rate-limit refusals
// with the operator's organisation id, a UUID — "would exceed the rate limit for your
// organization (0dccdde6-…) of 20,000 input tokens per minute", and in its newer wording "(org:
// 8016…, model: …)" — the id the gateway keeps from callers in the Anthropic-Organization-Id
// header (TestOperatorAccountHeadersNotRelayed). Only OpenAI's org-/proj_ ids were redacted
// from a relayed 4xx, so every caller of /v1/messages rate-limited at the provider (and of the
// token counter) read the operator's organisation id.
func TestAnthropicOrganizationNotNamedInRelayedErrors(t *testing.T) {
	const org, org2 = "0dccdde6-f924-4f1b-bb3b-92ef846e0a5b", "80162711-722B-4454-ae75-c6334e6796f2"
	const msgBody = `{"model":"claude-test","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct{ name, path, body, message string }{
		{"older wording", "/v1/messages", msgBody, "This request would exceed the rate limit for your organization (" + org +
			") of 20,000 input tokens per minute. For details, refer to: https://docs.anthropic.com/en/api/rate-limits."},
		{"newer wording", "/v1/messages", msgBody, "This request would exceed your organization's rate limit of 30,000 input tokens per minute (org: " + org2 +
			", model: claude-test). For details, refer to: https://docs.claude.com/en/api/rate-limits."},
		{"token counter", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`,
			"This request would exceed the rate limit for your organization (" + org + ") of 100 requests per minute."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := failureHarness(t, failingUpstream(http.StatusTooManyRequests,
				map[string]string{"Anthropic-Organization-Id": org, "Retry-After": "3"},
				`{"type":"error","error":{"type":"rate_limit_error","message":"`+tc.message+`"},"request_id":"req_011CZRtHe9vmeRRMu6G4rMhJ"}`))
			_, key := h.user("standard")
			resp := h.post(key, tc.path, tc.body, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "3" {
				t.Fatalf("status %d, Retry-After %q: %s, want the upstream's 429 and its advice", resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
			for _, id := range []string{org, org2, strings.ToLower(org2)} {
				if strings.Contains(string(body), id) {
					t.Errorf("the relayed error names the operator's organisation %s: %s", id, body)
				}
			}
			if !strings.Contains(string(body), "rate_limit_error") || !strings.Contains(string(body), "req_011CZRtHe9vmeRRMu6G4rMhJ") {
				t.Errorf("the relayed error lost the provider's words: %s", body)
			}
			if n, err := strconv.Atoi(resp.Header.Get("Content-Length")); err != nil || n != len(body) {
				t.Errorf("Content-Length %q for a body of %d bytes", resp.Header.Get("Content-Length"), len(body))
			}
		})
	}
}

// TestAccountHeaderValueRedactionKeepsTheErrorJSON: an account header's value is redacted
// wherever it stands in a relayed 4xx, and an OpenAI-compatible upstream may give its
// organisation a numeric id that its error also words as a JSON number. Replaced in place by
// "(redacted)", that number made the body JSON no client can parse ({"org_id":(redacted)}),
// relayed as application/json with the upstream's status. Such an answer is worded by the
// gateway, keeping the status and retry advice, as one it cannot read is.
func TestAccountHeaderValueRedactionKeepsTheErrorJSON(t *testing.T) {
	const org = "73418265"
	h, _ := failureHarness(t, failingUpstream(http.StatusTooManyRequests,
		map[string]string{"Openai-Organization": org, "Retry-After": "3"},
		`{"error":{"message":"Rate limit reached for organization `+org+`.","type":"rate_limit_error","org_id":`+org+`}}`))
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("status %d, Retry-After %q: %s, want the upstream's 429 and its advice", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if !json.Valid(body) {
		t.Fatalf("the relayed error is not JSON: %s", body)
	}
	if strings.Contains(string(body), org) {
		t.Errorf("the relayed error names the operator's organisation: %s", body)
	}
	if n, err := strconv.Atoi(resp.Header.Get("Content-Length")); err != nil || n != len(body) {
		t.Errorf("Content-Length %q for a body of %d bytes", resp.Header.Get("Content-Length"), len(body))
	}
}

// TestCallerEnvoyControlHeadersNotForwarded: Envoy (a service mesh's sidecar, an egress
// gateway in front of the provider) obeys x-envoy-* request headers from any request it takes
// as internal — and the gateway's are, coming from inside — and strips them only at its own
// edge, from outside callers. Passed on, a caller's headers set its retries and timeouts: a
// per-try timeout that cuts each attempt after the provider had it, retried, had the provider
// run the call several times, and the gateway charged it at 0 when the last attempt ended in
// Envoy's 504 (a refusal); retried on a status of the caller's choosing, several answers were
// made and one charged.
func TestCallerEnvoyControlHeadersNotForwarded(t *testing.T) {
	up, seen := recordingUpstream(nil)
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	control := map[string]string{
		"X-Envoy-Max-Retries":                    "5",
		"X-Envoy-Retry-On":                       "5xx,reset,retriable-status-codes",
		"X-Envoy-Retriable-Status-Codes":         "200",
		"X-Envoy-Upstream-Rq-Per-Try-Timeout-Ms": "1000",
		"X-Envoy-Upstream-Rq-Timeout-Ms":         "1000",
	}
	checkNotForwarded(t, postedHeaders(h, key, control, seen), control, "caller header")
}
