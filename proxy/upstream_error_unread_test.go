package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// refusedCalls are a model call on each metered route, each refused by its upstream with a
// status of its own (the caller's mistake, a rate limit, the provider's failure).
var refusedCalls = []struct {
	name, kind, path, body string
	status                 int
}{
	{"chat 500", "openai", "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`, 500},
	{"completions 400", "openai", "/v1/completions", `{"model":"fake-gpt","prompt":"hi"}`, 400},
	{"embeddings 503", "openai", "/v1/embeddings", `{"model":"fake-gpt","input":"hi"}`, 503},
	{"responses stream 429", "openai", "/v1/responses", `{"model":"fake-gpt","stream":true,"input":"hi"}`, 429},
	{"messages 529", "anthropic", "/v1/messages", `{"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`, 529},
}

// stalledRefusalRetryAfter is the retry advice stalledErrorUpstream's refusal sends.
const stalledRefusalRetryAfter = "7"

// stalledErrorUpstream answers every call status (with stalledRefusalRetryAfter) and the start
// of an error body, and sends the rest only when release is closed (never, unless the test
// closes it).
func stalledErrorUpstream(t *testing.T, status int, release <-chan struct{}) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", stalledRefusalRetryAfter)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"error":{"message":"The server`)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// TestCallerLeftWhileTheUpstreamsErrorWasReadIs499: a model call whose upstream refused it
// (any non-2xx status) and whose caller left (here: half-closed, so it still reads) while the
// refusal's body was read was answered, counted and logged with the upstream's status (a 4xx
// as upstream_refused "broken before its end", a 5xx as 502 upstream_error), the provider's
// doing. README: 499 client_closed_request, as for a caller that leaves before the headers;
// the hold is released at 0 (upstream_error), since the provider refused the call.
func TestCallerLeftWhileTheUpstreamsErrorWasReadIs499(t *testing.T) {
	for _, tc := range refusedCalls {
		t.Run(tc.name, func(t *testing.T) {
			up := stalledErrorUpstream(t, tc.status, nil)
			inner := &http.Transport{}
			t.Cleanup(inner.CloseIdleConnections)
			headers := make(chan struct{}, 1)
			core, logs := observer.New(zapcore.InfoLevel)
			h := newHarnessOn(t, harnessSetup{log: zap.New(core), transport: headersTransport{inner: inner, in: headers}}, func(c *config.Config) {
				c.Upstreams = []config.Upstream{{Name: "up", Kind: tc.kind, BaseURL: up.URL, Models: []string{"*"}}}
			})
			u, key := h.user("standard")
			// Half-closed once the gateway has the refusal's headers and reads its body, which stalls.
			resp, answer := halfClosedRequest(t, h, tc.path, "Authorization: Bearer "+key, tc.body,
				onSignal(t, headers, "the upstream's refusal"))
			if resp.StatusCode != 499 || !strings.Contains(answer, "client_closed_request") {
				t.Fatalf("a caller that left while its upstream's refusal was read got %d %q, want 499 client_closed_request",
					resp.StatusCode, answer)
			}
			runID := resp.Header.Get(proxy.RunIDHeader)
			run := h.run(u.ID, runID)
			if run.State != holds.StateSettled || run.SettleSource.String != holds.SourceUpstreamError || run.ChargedMicro != 0 {
				t.Fatalf("run settled %s/%s charged %d µUSD: the provider refused the call, want upstream_error at 0",
					run.State, run.SettleSource.String, run.ChargedMicro)
			}
			series := fmt.Sprintf(`tollgate_requests_total{code="499",route=%q}`, tc.path)
			waitFor(t, "the call's 499 to be counted", func() bool { return h.metric(series) == "1" })
			for _, l := range logs.All() {
				f := l.ContextMap()
				if f["run_id"] == runID && f["code"] == "client_closed_request" && l.Level == zapcore.InfoLevel {
					return
				}
			}
			t.Fatalf("no INFO line client_closed_request for run %s", runID)
		})
	}
}

// TestUpstreamErrorStalledPastTheTimeoutIs504: a model call whose upstream refused it and then
// stalled in its refusal's body past limits.upstream_timeout did not answer in time, yet was
// answered with the upstream's status (a 4xx as upstream_refused, a 5xx as 502
// upstream_error), a broken answer. README: 504 upstream_timeout; nothing is charged, since
// the provider refused the call. The refusal's retry advice (its Retry-After) goes on, as on a
// 5xx answered 502, so that an SDK backs off as the provider asked.
func TestUpstreamErrorStalledPastTheTimeoutIs504(t *testing.T) {
	for _, tc := range refusedCalls {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			up := stalledErrorUpstream(t, tc.status, release)
			h := newHarness(t, func(c *config.Config) {
				c.Upstreams = []config.Upstream{{Name: "up", Kind: tc.kind, BaseURL: up.URL, Models: []string{"*"}}}
				// The timeout runs from before the request is written: at 500 ms a loaded
				// machine could run out of it before the refusal's headers came, and the call,
				// which the provider had whole, was charged its prompt as upstream_timeout.
				c.Limits.UpstreamTimeout = timeoutAfterTheRequest
			})
			u, key := h.user("standard")
			resp := h.post(key, tc.path, tc.body, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusGatewayTimeout || errorCode(t, body) != "upstream_timeout" {
				t.Fatalf("%d %s, want 504 upstream_timeout", resp.StatusCode, body)
			}
			if got := resp.Header.Get("Retry-After"); got != stalledRefusalRetryAfter {
				t.Errorf("Retry-After %q, want the refusal's %q", got, stalledRefusalRetryAfter)
			}
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			if run.State != holds.StateSettled || run.SettleSource.String != holds.SourceUpstreamError || run.ChargedMicro != 0 {
				t.Fatalf("run settled %s/%s charged %d µUSD: the provider refused the call, want upstream_error at 0",
					run.State, run.SettleSource.String, run.ChargedMicro)
			}
			series := fmt.Sprintf(`tollgate_requests_total{code="504",route=%q}`, tc.path)
			waitFor(t, "the call's 504 to be counted", func() bool { return h.metric(series) == "1" })
		})
	}
}

// TestCountRefusalUnreadIsTheCallersOrATimeout: a token count refused by its upstream (here
// 500) shares a model call's relay of the refusal: one whose body stalled past
// limits.header_timeout (a count's whole answer) was answered 502 upstream_error, one whose
// caller left while it was read the same. README: 504 upstream_timeout, and 499
// client_closed_request, as for a count answered 200.
func TestCountRefusalUnreadIsTheCallersOrATimeout(t *testing.T) {
	const body = `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`
	t.Run("stalled", func(t *testing.T) {
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		up := stalledErrorUpstream(t, http.StatusInternalServerError, release)
		h := newHarness(t, func(c *config.Config) {
			c.Upstreams = []config.Upstream{{Name: "up", Kind: "anthropic", BaseURL: up.URL, Models: []string{"*"}}}
			c.Limits.HeaderTimeout = 300 * time.Millisecond
		})
		_, key := h.user("standard")
		resp := h.post(key, "/v1/messages/count_tokens", body, nil)
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(answer), `"upstream_timeout"`) {
			t.Fatalf("%d %s, want 504 upstream_timeout", resp.StatusCode, answer)
		}
	})
	t.Run("caller left", func(t *testing.T) {
		up := stalledErrorUpstream(t, http.StatusInternalServerError, nil)
		inner := &http.Transport{}
		t.Cleanup(inner.CloseIdleConnections)
		headers := make(chan struct{}, 1)
		h := newHarnessOn(t, harnessSetup{transport: headersTransport{inner: inner, in: headers}}, func(c *config.Config) {
			c.Upstreams = []config.Upstream{{Name: "up", Kind: "anthropic", BaseURL: up.URL, Models: []string{"*"}}}
		})
		_, key := h.user("standard")
		resp, answer := halfClosedRequest(t, h, "/v1/messages/count_tokens", "X-Api-Key: "+key, body,
			onSignal(t, headers, "the upstream's refusal"))
		if resp.StatusCode != 499 || !strings.Contains(answer, "client_closed_request") {
			t.Fatalf("got %d %q, want 499 client_closed_request", resp.StatusCode, answer)
		}
	})
}
