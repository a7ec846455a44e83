package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
)

// A 200 whose body is text that is neither JSON nor an event stream — a proxy's or CDN's
// maintenance page that does not open with a tag, an Envoy "upstream connect error" — is no
// model's answer, as a web page is not: 502 upstream_error, charged nothing. It was relayed as
// a 200 the SDKs cannot parse (they raise) and charged the prompt's estimate, on every call
// and every SDK retry for as long as the page stood there.
func TestPlainTextAnswerIsNoAnswer(t *testing.T) {
	for _, tc := range []struct{ name, ctype, body string }{
		{"html without a tag first", "text/html; charset=utf-8", "Service temporarily unavailable"},
		{"envoy text", "text/plain", "upstream connect error or disconnect/reset before headers. reset reason: connection termination"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				fmt.Fprint(w, tc.body)
			}, nil)
			u, key := h.user("standard")
			status, body, run := h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
			if status != http.StatusBadGateway || errorCode(t, body) != "upstream_error" {
				t.Errorf("%d %s, want 502 upstream_error", status, body)
			}
			if run.ChargedMicro != 0 || run.SettleSource.String != "upstream_error" {
				t.Errorf("charged %d (%s, estimated %v), want 0 (upstream_error)", run.ChargedMicro, run.SettleSource.String, run.Estimated)
			}
		})
	}
}

// TestOKErrorObjectIsLogged: a 200 whose JSON body is an error object (some OpenAI-compatible
// servers answer a failure so) is relayed as sent and charged nothing, since the provider
// reported no usage — and, until now, left no line in the gateway's log, so an operator could
// not see that every call of a broken upstream was failing. It writes one WARN line naming the
// run and the upstream's error.
func TestOKErrorObjectIsLogged(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"error":{"message":"model overloaded","type":"server_error","code":"overloaded"}}`)
	}))
	t.Cleanup(srv.Close)
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "hostile", Kind: "openai", BaseURL: srv.URL, Models: []string{"*"}}}
	})
	u, key := h.user("standard")
	status, _, run := h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
	if status != http.StatusOK || run.ChargedMicro != 0 {
		t.Fatalf("%d, charged %d: want the 200 relayed, charged nothing", status, run.ChargedMicro)
	}
	lines := logs.FilterMessage("upstream answered 200 with an error object").All()
	if len(lines) != 1 {
		t.Fatalf("%d lines 'upstream answered 200 with an error object', want 1", len(lines))
	}
	fields := lines[0].ContextMap()
	if fields["run_id"] != run.RunID || fields["error_type"] != "server_error" || fields["error_message"] != "model overloaded" {
		t.Errorf("log fields %v, want the run id and the upstream's error", fields)
	}
}

// TestOKErrorObjectLogLineIsBounded: what the line quotes of the error object is bounded as
// every quote of a peer's bytes is (512 bytes): its type was quoted whole, so an upstream's
// 200 could write up to max_response_bytes into one log line.
func TestOKErrorObjectLogLineIsBounded(t *testing.T) {
	huge := strings.Repeat("t", 100_000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"error":{"message":%q,"type":%q}}`, huge, huge)
	}))
	t.Cleanup(srv.Close)
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "hostile", Kind: "openai", BaseURL: srv.URL, Models: []string{"*"}}}
	})
	u, key := h.user("standard")
	h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
	lines := logs.FilterMessage("upstream answered 200 with an error object").All()
	if len(lines) != 1 {
		t.Fatalf("%d lines 'upstream answered 200 with an error object', want 1", len(lines))
	}
	for k, v := range lines[0].ContextMap() {
		if s, ok := v.(string); ok && len(s) > 512 {
			t.Errorf("field %s quotes %d bytes of the upstream's answer, want at most 512", k, len(s))
		}
	}
}

// TestEmptyOKAnswerIsBroken: a 200 with nothing in it (or white space alone) is no answer, and
// may be one cut before its first byte: 502 upstream_broken, settled stream_error, as an answer
// cut later is. Relayed, the SDKs could not read it, and it ended complete.
func TestEmptyOKAnswerIsBroken(t *testing.T) {
	for _, body := range []string{"", " \n"} {
		h := fixedAnswerHarness(t, false, body)
		u, key := h.user("standard")
		status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
		if status != http.StatusBadGateway || errorCode(t, answer) != "upstream_broken" {
			t.Errorf("body %q: %d %s, want 502 upstream_broken", body, status, answer)
		}
		if run.SettleSource.String != "stream_error" {
			t.Errorf("body %q: settled %s, want stream_error", body, run.SettleSource.String)
		}
	}
}
