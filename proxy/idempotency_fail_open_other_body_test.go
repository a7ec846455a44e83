package proxy_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemAnswerOfAnotherBodyRunUnderFailOpenIsNotReplayedToTheFirst: a key's first attempt
// (body X) failed upstream, so its record holds X's hash and the key is free for its next
// attempt. A request under the key with another body (Y) reaches a gateway running with
// dedup.fail_open while its read of the record fails: the body cannot be compared, and Y runs
// as the key's next attempt, as fail_open lets it. Its answer is then stored in the record,
// which still names X's body: X's retry, with the record readable again, was replayed Y's
// answer (Idempotent-Replayed: true), the answer to a request its caller never sent, and Y's
// retry was refused 422 for the key's first body. A key's stored answer goes with the body that
// asked for it: X's retry is told the key was used with another body, Y's gets its answer.
func TestIdemAnswerOfAnotherBodyRunUnderFailOpenIsNotReplayedToTheFirst(t *testing.T) {
	h, reads := newRecordReadsHarness(t, true)
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "fail-open-other-body"}
	if first := send(h.gw.URL, key, chatBody, with(idem, fakellm.HeaderStatus, "500")); first.status != http.StatusBadGateway {
		t.Fatalf("first attempt: %d %s, want 502", first.status, first.body)
	}
	h.settled()

	other := `{"model":"fake-gpt","messages":[{"role":"user","content":"A different question altogether."}]}`
	reads.on.Store(true)
	y := sendOK(t, "another body under the key, its record unread (fail_open)", h.gw.URL, key, other, idem)
	reads.on.Store(false)
	h.settled()
	calls := h.fake.Calls()

	x := send(h.gw.URL, key, chatBody, idem)
	if x.header.Get(proxy.ReplayedHeader) != "" || bytes.Equal(x.body, y.body) {
		t.Fatalf("retry of the first body: %d %v %s; replayed the answer of the other body (run %s)",
			x.status, x.header, x.body, y.header.Get(proxy.RunIDHeader))
	}
	again := send(h.gw.URL, key, other, idem)
	if again.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(again.body, y.body) {
		t.Fatalf("retry of the other body: %d %v %s, want its own answer replayed", again.status, again.header, again.body)
	}
	if n := h.fake.Calls(); n != calls {
		t.Fatalf("%d upstream calls after the retries, want %d", n, calls)
	}
}
