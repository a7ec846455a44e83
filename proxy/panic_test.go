package proxy_test

import (
	"net/http"
	"strings"
	"testing"

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
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d, want the connection closed by the panic", resp.StatusCode)
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
