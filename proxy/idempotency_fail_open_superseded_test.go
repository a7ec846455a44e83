package proxy_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemAnswerPinnedUnderFailOpenAfterASupersededAttemptIsReplayed: a key's first attempt
// was a session message a newer one superseded, so its record says superseded and every retry
// of it is 409 superseded. A request under the key with another body then reaches a gateway
// running with dedup.fail_open while its read of the record fails: it runs as the key's next
// attempt, as fail_open lets it, and its caller is sent a whole answer, which pins the key. Its
// retries were then refused 409 superseded, by the mark of the attempt before it, though the
// key holds their answer: a caller told a charged call was replaced by a newer message. The
// answer that pins the key is what its retries get.
func TestIdemAnswerPinnedUnderFailOpenAfterASupersededAttemptIsReplayed(t *testing.T) {
	h, reads := newRecordReadsHarness(t, true)
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "fail-open-superseded"}
	old := `{"model":"fake-gpt","messages":[{"role":"user","content":"the old question"}]}`
	first := make(chan answer, 1)
	go func() {
		first <- send(h.gw.URL, key, old, with(with(idem, proxy.SessionHeader, "tab-s"), fakellm.HeaderLatency, "2s"))
	}()
	h.waitUpstream(1)
	newer := sendOK(t, "the newer message of the session", h.gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: "tab-s"})
	if a := <-first; a.status != http.StatusConflict || errorCode(t, a.body) != "superseded" {
		t.Fatalf("old message: %d %s, want 409 superseded", a.status, a.body)
	}
	h.settled()
	if again := send(h.gw.URL, key, old, idem); again.status != http.StatusConflict || errorCode(t, again.body) != "superseded" {
		t.Fatalf("the old message's retry: %d %s, want 409 superseded (the record is read)", again.status, again.body)
	}

	other := `{"model":"fake-gpt","messages":[{"role":"user","content":"A different question altogether."}]}`
	reads.on.Store(true)
	y := sendOK(t, "another body under the key, its record unread (fail_open)", h.gw.URL, key, other, idem)
	reads.on.Store(false)
	h.settled()
	calls := h.fake.Calls()

	again := send(h.gw.URL, key, other, idem)
	if again.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(again.body, y.body) {
		t.Fatalf("retry of the pinned body: %d %v %s, want its answer replayed (run %s; newer message run %s)",
			again.status, again.header, again.body, y.header.Get(proxy.RunIDHeader), newer.header.Get(proxy.RunIDHeader))
	}
	if n := h.fake.Calls(); n != calls {
		t.Fatalf("%d upstream calls after the retry, want %d", n, calls)
	}
}
