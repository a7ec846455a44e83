package proxy_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestSupersededIdempotentRetryDoesNotReplaceNewerMessage: a session message sent with an
// Idempotency-Key is running; its SDK's retry is told 409 request_in_progress with
// X-Should-Retry: true. A newer message of the session then supersedes it. The SDK retries as
// it was told. README: a superseded message's retry would replace the newer one, which is why
// superseded is never to be retried; the key's retry must not run the old message again.
func TestSupersededIdempotentRetryDoesNotReplaceNewerMessage(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	old := `{"model":"fake-gpt","messages":[{"role":"user","content":"the old question"}]}`
	oldHdr := map[string]string{proxy.SessionHeader: "tab-k", "Idempotency-Key": "old-q", fakellm.HeaderLatency: "2s"}
	first := make(chan answer, 1)
	go func() { first <- send(h.gw.URL, key, old, oldHdr) }()
	h.waitUpstream(1)
	retry := send(h.gw.URL, key, old, oldHdr)
	if retry.status != 409 || errorCode(t, retry.body) != "request_in_progress" || retry.header.Get("X-Should-Retry") != "true" {
		t.Fatalf("retry while running: %d %v %s", retry.status, retry.header, retry.body)
	}
	newer := make(chan answer, 1)
	go func() {
		newer <- send(h.gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: "tab-k", fakellm.HeaderLatency: "2s"})
	}()
	a := <-first
	if a.status != 409 || errorCode(t, a.body) != "superseded" {
		t.Fatalf("old message: %d %s, want 409 superseded", a.status, a.body)
	}
	h.waitUpstream(2)
	h.waitSettled(errorRunID(t, retry.body), 5*time.Second, "the superseded attempt ended")
	// The SDK retries the request it was told to retry.
	again := send(h.gw.URL, key, old, map[string]string{proxy.SessionHeader: "tab-k", "Idempotency-Key": "old-q"})
	// Told it was superseded, and not to retry: a 409 request_in_progress would send the SDK
	// round again, for as long as the record lives.
	if again.status != 409 || errorCode(t, again.body) != "superseded" || again.header.Get("X-Should-Retry") != "false" {
		t.Errorf("the old message's retry: %d %v %s, want 409 superseded, X-Should-Retry false", again.status, again.header, again.body)
	}
	if n := <-newer; n.status != 200 {
		t.Errorf("the newer message: %d %s, want 200 (it was replaced by the retry of the message it superseded)", n.status, n.body)
	}
	if c := h.fake.Calls(); c != 2 {
		t.Errorf("%d upstream calls, want 2 (the old message and the newer one)", c)
	}
}
