package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// A call that panics before the provider had its request used nothing: its hold is released at
// 0, as a call refused before forwarding. It was charged its prompt's estimate, as a stream
// that broke, for a failure of the gateway's own.
func TestPanicBeforeForwardingChargesNothing(t *testing.T) {
	run, _ := panickingCall(t, false)
	if run.SettleSource.String != holds.SourceRelease || run.ChargedMicro != 0 {
		t.Fatalf("run = source %q charged %d, want released at 0", run.SettleSource.String, run.ChargedMicro)
	}
}

// A call that panics once the provider had its whole request may have been worked on: it is
// charged as a stream that broke, its prompt's estimate.
func TestPanicAfterForwardingChargesThePromptsEstimate(t *testing.T) {
	run, _ := panickingCall(t, true)
	if run.SettleSource.String != holds.SourceStreamError || run.ChargedMicro <= 0 || !run.Estimated {
		t.Fatalf("run = source %q charged %d estimated %v, want stream_error at the prompt's estimate",
			run.SettleSource.String, run.ChargedMicro, run.Estimated)
	}
}

// TestPanickedCallIsCountedAsAFailure: tollgate_requests_total counts every model call, and an
// operator reads the gateway's failures from its 5xx. A call whose handler panicked was counted
// nowhere (the count came after the handler returned, which it never did): the gateway's own
// bug showed as fewer calls, not as failures. It counts as a 500.
func TestPanickedCallIsCountedAsAFailure(t *testing.T) {
	for _, sent := range []bool{false, true} {
		_, h := panickingCall(t, sent)
		const series = `tollgate_requests_total{code="500",route="/v1/chat/completions"}`
		if got := h.metric(series); got != "1" {
			t.Errorf("sent %v: %s = %q after a call that panicked, want 1", sent, series, got)
		}
	}
}

// panickingCall sends one chat call through a gateway whose transport panics, before sending
// anything or after the upstream answered (sent), and returns the call's settled run and the
// gateway.
func panickingCall(t *testing.T, sent bool) (holds.Run, *harness) {
	t.Helper()
	inner := &http.Transport{}
	t.Cleanup(inner.CloseIdleConnections)
	h := newHarnessOn(t, harnessSetup{transport: panicTransport{inner: inner, sent: sent}}, nil)
	u, key := h.user("standard")
	req, _ := http.NewRequest(http.MethodPost, h.gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	switch {
	case !sent && err == nil:
		resp.Body.Close()
		t.Fatalf("answered %d, want the connection closed by the panic", resp.StatusCode)
	case sent && err != nil:
		t.Fatalf("%v, want a 500 answer: the call is charged, and an SDK resends a closed connection", err)
	case sent:
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || errorCode(t, body) != "internal_error" || resp.Header.Get("X-Should-Retry") != "false" {
			t.Fatalf("answered %d %s (X-Should-Retry %q), want 500 internal_error, not to be retried",
				resp.StatusCode, body, resp.Header.Get("X-Should-Retry"))
		}
	}
	h.settled()
	var runIDs []string
	if err := h.db.Select(&runIDs, "SELECT run_id FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if len(runIDs) != 1 {
		t.Fatalf("%d holds, want the call's one", len(runIDs))
	}
	return h.run(u.ID, runIDs[0]), h
}

// panicTransport panics in place of an answer: at once, or once inner has sent the request
// and read the answer's headers (sent).
type panicTransport struct {
	inner http.RoundTripper
	sent  bool
}

func (p panicTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !p.sent {
		panic("test: panic before the request is sent")
	}
	if resp, err := p.inner.RoundTrip(req); err == nil {
		resp.Body.Close()
	}
	panic("test: panic after the request was sent")
}

// TestPanicValueInTheLogHoldsNoKeyAndIsBounded: a panic's value is logged as what it quotes,
// and an error can quote an upstream's answer (a body wrapped in it), which may echo the
// operator's key. The line that says what the call was settled at quoted the value whole: the
// key in every spelling and however long; and net/http, given the panic again, logged it a
// second time through the server's log. A token count, which is no call and has no settlement
// to recover its panic, reached net/http's line alone. The value is quoted as any other quote
// of an upstream (no spelling of the key, at most 512 bytes) and said once, with the panic's
// own stack. Each upstream has a key of its own: a panic outside any one call (the token
// count's) has every configured upstream's replaced, not only the first's.
func TestPanicValueInTheLogHoldsNoKeyAndIsBounded(t *testing.T) {
	const opKey = "opsecret/0123456789+abcdefXYZ<&>"
	for _, tc := range []struct{ name, path, body, authHeader, authPrefix string }{
		{"model call", "/v1/chat/completions", chatBody, "Authorization", "Bearer "},
		{"token count", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`, "X-Api-Key", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			h := newHarnessOn(t, harnessSetup{log: zap.New(core, zap.AddStacktrace(zapcore.ErrorLevel)), serverLog: true, transport: echoPanicTransport{}}, func(c *config.Config) {
				for i := range c.Upstreams {
					c.Upstreams[i].APIKey = fmt.Sprint(opKey, i) // each its own: every one looked for
				}
			})
			_, key := h.user("standard")
			req, _ := http.NewRequest(http.MethodPost, h.gw.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set(tc.authHeader, tc.authPrefix+key)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				t.Fatalf("answered %d, want the connection closed by the panic", resp.StatusCode)
			}
			h.settled()
			said := 0
			for _, e := range logs.All() {
				if strings.Contains(e.Message, "0123456789") {
					t.Errorf("line %.300q holds the operator's key", e.Message)
				}
				for k, v := range e.ContextMap() {
					s := fmt.Sprint(v)
					if strings.Contains(s, "0123456789") {
						t.Errorf("line %q, field %s holds the operator's key: %.300q", e.Message, k, s)
					}
					if k == "panic" {
						said++
						if len(s) > 512 || !strings.Contains(s, "(redacted)") {
							t.Errorf("panic quoted as %d bytes %.600q, want the key redacted, at most 512 bytes", len(s), s)
						}
						if !strings.Contains(e.Stack, "echoPanicTransport.RoundTrip") {
							t.Errorf("the panic's line has the stack %q, want the one that panicked", e.Stack)
						}
					}
				}
			}
			if said != 1 {
				t.Errorf("the panic's value was logged %d times, want once", said)
			}
		})
	}
}

// echoPanicTransport panics with an error quoting the answer of an upstream that echoes the
// key it was sent in each spelling an answer may hold it in (as sent, JSON-escaped by Go and
// with \/, URL-escaped), and at the end of 2 KiB.
type echoPanicTransport struct{}

func (echoPanicTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
	if key == "" {
		key = req.Header.Get("X-Api-Key") // Anthropic's
	}
	goJSON, _ := json.Marshal(key)
	body := fmt.Sprintf(`{"error":{"message":"Incorrect API key provided: %s"}} %s %s %s %s%s`, goJSON[1:len(goJSON)-1], key,
		strings.ReplaceAll(key, "/", `\/`), url.QueryEscape(key), strings.Repeat("p", 2048), key)
	panic(fmt.Errorf("test: upstream answered 401: %s", body))
}

// A call that panics once the provider had its request is charged its prompt's estimate. Its
// connection closed, the OpenAI and Anthropic SDKs sent it again, twice by default — they
// resend on a connection error — and each resend that panicked alike was charged again: three
// charges for no answer. It is answered 500 internal_error with X-Should-Retry: false, and sent
// once.
func TestSDKDoesNotResendACallThatPanickedAfterForwarding(t *testing.T) {
	inner := &http.Transport{}
	t.Cleanup(inner.CloseIdleConnections)
	h := newHarnessOn(t, harnessSetup{transport: panicTransport{inner: inner, sent: true}}, nil)
	for _, sdk := range []string{"openai", "anthropic"} {
		u, key := h.user("standard")
		var attempts int
		if sdk == "openai" {
			var log attemptLog
			c := sdkClient(h, key, &log)
			_, err := c.Chat.Completions.New(context.Background(), sdkParams)
			attempts = len(log.all())
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusInternalServerError || apiErr.Code != "internal_error" {
				t.Errorf("%s: err %v, want 500 internal_error", sdk, err)
			}
		} else {
			var log aLog
			c := aClient(h, key, &log)
			_, err := c.Messages.New(context.Background(), aParams)
			attempts = len(log.st)
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusInternalServerError {
				t.Errorf("%s: err %v, want 500", sdk, err)
			}
		}
		runs := h.holdsOf(u.ID)
		charged := 0
		for _, r := range runs {
			if r.ChargedMicro > 0 {
				charged++
			}
		}
		if attempts != 1 || len(runs) != 1 || charged != 1 {
			t.Errorf("%s: %d attempts, %d runs, %d charged; want the call sent once, charged once", sdk, attempts, len(runs), charged)
		}
	}
}
