package proxy_test

import (
	"net/http"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/proxy"
)

// TestRefusalNamesTheRequestItsLogLineNames: a refused call's log line carried a run id its
// caller was never told (a refusal names no run), so a caller could not point an operator
// at the line that says why. Every model call's answer now carries X-Tollgate-Request-Id,
// and every line of the call carries it as request_id: a refusal's (with no run id header),
// and an answered call's, whose request id is its run id.
func TestRefusalNamesTheRequestItsLogLineNames(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	_, key := h.user("standard")

	refused := h.post(key, "/v1/chat/completions", `{"model":`, nil)
	readAll(t, refused.Body)
	refused.Body.Close()
	if refused.StatusCode != http.StatusBadRequest {
		t.Fatalf("broken JSON: %d, want 400", refused.StatusCode)
	}
	id := refused.Header.Get(proxy.RequestIDHeader)
	if id == "" || refused.Header.Get(proxy.RunIDHeader) != "" {
		t.Fatalf("refusal: request id %q, run id %q; want a request id and no run id", id, refused.Header.Get(proxy.RunIDHeader))
	}
	lines := logs.FilterMessage("request refused").FilterField(zap.String("request_id", id)).All()
	if len(lines) != 1 {
		t.Fatalf("%d 'request refused' lines with request_id %s, want 1 (all lines: %v)", len(lines), id, logs.All())
	}

	answered := h.post(key, "/v1/chat/completions", chatBody, nil)
	readAll(t, answered.Body)
	answered.Body.Close()
	if got, run := answered.Header.Get(proxy.RequestIDHeader), answered.Header.Get(proxy.RunIDHeader); got == "" || got != run || got == id {
		t.Fatalf("answered call: request id %q, run id %q (the refusal's was %q); want its run id, new", got, run, id)
	}
}

// TestReplayNamesItsOwnRequest: a replay under an Idempotency-Key answers with the first
// attempt's run id but its own request id: its log lines are its own, not the first's.
func TestReplayNamesItsOwnRequest(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	idem := map[string]string{"Idempotency-Key": "req-id-replay"}
	first := h.post(key, "/v1/chat/completions", chatBody, idem)
	readAll(t, first.Body)
	first.Body.Close()
	h.settled()
	again := h.post(key, "/v1/chat/completions", chatBody, idem)
	readAll(t, again.Body)
	again.Body.Close()
	if again.Header.Get(proxy.ReplayedHeader) != "true" {
		t.Fatalf("second attempt not replayed: %d %v", again.StatusCode, again.Header)
	}
	if a, b := first.Header.Get(proxy.RequestIDHeader), again.Header.Get(proxy.RequestIDHeader); a == "" || b == "" || a == b {
		t.Fatalf("request ids %q and %q, want two different ones", a, b)
	}
	if first.Header.Get(proxy.RunIDHeader) != again.Header.Get(proxy.RunIDHeader) {
		t.Fatalf("replay names run %q, first attempt %q", again.Header.Get(proxy.RunIDHeader), first.Header.Get(proxy.RunIDHeader))
	}
}
