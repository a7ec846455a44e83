package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
)

// failingUpstream answers every call with status, the provider's request ids and the retry
// advice in hdr, and body.
func failingUpstream(status int, hdr map[string]string, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req_openai_1")
		w.Header().Set("Request-Id", "req_anthropic_1")
		for k, v := range hdr {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}
}

// failureHarness is a gateway whose OpenAI and Anthropic upstreams are both upstream, logging
// to an observer.
func failureHarness(t *testing.T, upstream http.HandlerFunc) (*harness, *observer.ObservedLogs) {
	srv := httptest.NewServer(upstream)
	t.Cleanup(srv.Close)
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{
			{Name: "fail-anthropic", Kind: "anthropic", BaseURL: srv.URL, Models: []string{"claude*"}},
			{Name: "fail-openai", Kind: "openai", BaseURL: srv.URL, Models: []string{"*"}},
		}
	})
	return h, logs
}

// An upstream 5xx is answered 502 in the gateway's words, but what the provider said about
// retrying (Retry-After, Retry-After-Ms, X-Should-Retry) and its request id reach the caller, and
// the request id the log: an SDK backs off as the provider asked (it retried at once, twice,
// against an overloaded provider, and again when the provider said not to), and support can
// take the provider's request id of a failed call to the provider.
func TestUpstream5xxKeepsRetryAdviceAndRequestID(t *testing.T) {
	h, logs := failureHarness(t, failingUpstream(http.StatusServiceUnavailable,
		map[string]string{"Retry-After": "30", "Retry-After-Ms": "30000", "X-Should-Retry": "false"},
		`{"error":{"message":"overloaded","type":"server_error"}}`))
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_error" {
		t.Fatalf("%d %s, want 502 upstream_error", resp.StatusCode, body)
	}
	for k, want := range map[string]string{"Retry-After": "30", "Retry-After-Ms": "30000", "X-Should-Retry": "false",
		"X-Request-Id": "req_openai_1", "Request-Id": "req_anthropic_1"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s: %q, want the upstream's %q", k, got, want)
		}
	}
	if resp.Header.Get("X-Tollgate-Run-Id") == "" {
		t.Error("no X-Tollgate-Run-Id")
	}
	lines := logs.FilterMessage("upstream refused the call").FilterField(zap.String("upstream_request_id", "req_openai_1")).Len()
	if lines != 1 {
		t.Errorf("%d 'upstream refused the call' lines name the upstream's request id, want 1", lines)
	}

	// The OpenAI SDK does as the provider said: no retry.
	var log attemptLog
	c := sdkClient(h, key, &log)
	_, err := c.Chat.Completions.New(context.Background(), sdkParams)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway {
		t.Fatalf("SDK: %v", err)
	}
	if n := len(log.all()); n != 1 {
		t.Errorf("the OpenAI SDK made %d attempts, want 1: the upstream said X-Should-Retry: false", n)
	}
	h.expectCharges(u.ID, nil, "upstream_error")
}

// Anthropic's 529 overloaded_error: 502 in Anthropic's shape, with Anthropic's request-id.
func TestAnthropicOverloadedKeepsRequestID(t *testing.T) {
	h, _ := failureHarness(t, failingUpstream(529, map[string]string{"X-Should-Retry": "false"},
		`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`))
	u, key := h.user("standard")
	var l aLog
	c := aClient(h, key, &l)
	_, err := c.Messages.New(context.Background(), aParams)
	sdkReadable(t, "529", http.StatusBadGateway, "api_error", err)
	var ae *anthropic.Error
	if errors.As(err, &ae) && ae.RequestID != "req_anthropic_1" {
		t.Errorf("the Anthropic SDK read request id %q, want the upstream's req_anthropic_1", ae.RequestID)
	}
	if len(l.st) != 1 {
		t.Errorf("the Anthropic SDK made %d attempts (%v), want 1: the upstream said X-Should-Retry: false", len(l.st), l.st)
	}
	h.expectCharges(u.ID, nil, "upstream_error")
}

// An answer that broke after its headers is charged its prompt's estimate: the caller's 502
// carries the provider's request id, and so does the log line, so the charge can be traced.
func TestBrokenAnswerKeepsRequestID(t *testing.T) {
	h, logs := failureHarness(t, func(w http.ResponseWriter, r *http.Request) {
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		fmt.Fprint(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: req_cut_1\r\nContent-Length: 5000\r\n\r\n{\"id\":\"x\",\"choices\":[")
		bw.Flush()
	})
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_broken" {
		t.Fatalf("%d %s, want 502 upstream_broken", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-Request-Id"); got != "req_cut_1" {
		t.Errorf("X-Request-Id %q, want the upstream's req_cut_1", got)
	}
	if n := logs.FilterMessage("upstream body broke").FilterField(zap.String("upstream_request_id", "req_cut_1")).Len(); n != 1 {
		t.Errorf("%d 'upstream body broke' lines name the upstream's request id, want 1", n)
	}
	run := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
	if run.ChargedMicro <= 0 || run.SettleSource.String != "stream_error" {
		t.Errorf("charged %d source %s, want the prompt's estimate (stream_error)", run.ChargedMicro, run.SettleSource.String)
	}
}
