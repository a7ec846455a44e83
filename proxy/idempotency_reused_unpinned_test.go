package proxy_test

import (
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestIdempotentKeyReusedAfterAFailedAttemptIsRefused: a key whose first attempt failed (an
// upstream 5xx: the key is not pinned, its record holds the body and the next attempt) is
// still that body's key. Another body under it is 422 idempotency_key_reused and never runs:
// run, it would be charged, and its answer, stored under the key's first body, would be
// replayed to that body's retry. Only a record with an answer (replay) checked the body before.
func TestIdempotentKeyReusedAfterAFailedAttemptIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first := send(h.gw.URL, key, chatBody, map[string]string{"Idempotency-Key": "k-failed", fakellm.HeaderStatus: "500"})
	if first.status != 502 {
		t.Fatalf("first attempt: %d %s, want 502", first.status, first.body)
	}
	h.settled()
	other := `{"model":"fake-gpt","messages":[{"role":"user","content":"another question"}]}`
	reused := send(h.gw.URL, key, other, map[string]string{"Idempotency-Key": "k-failed"})
	if reused.status != 422 || errorCode(t, reused.body) != "idempotency_key_reused" {
		t.Fatalf("another body under the key: %d %s, want 422 idempotency_key_reused", reused.status, reused.body)
	}
	if c := h.fake.Calls(); c != 1 {
		t.Errorf("%d upstream calls, want 1 (the failed attempt only)", c)
	}
	h.settled()
	h.expectCharges(u.ID, nil, holds.SourceUpstreamError)
}
