package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdempotencyKeyIsScopedToTheUser: an Idempotency-Key names a request of its user only
// (DESIGN §6: the run id hashes user and key). Two customers' SDKs that both number their
// requests "job-1" must each be run and charged: a key shared across users would replay the
// first user's answer to the second (their data, to another customer) and charge the second
// nothing. No test failed when the user was left out of the key's scope.
func TestIdempotencyKeyIsScopedToTheUser(t *testing.T) {
	h := newHarness(t, nil)
	ua, keyA := h.user("standard")
	ub, keyB := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "job-1"}
	a := sendOK(t, "user A", h.gw.URL, keyA, chatBody, idem)
	h.settled()
	b := sendOK(t, "user B, same key and body", h.gw.URL, keyB, chatBody, idem)
	if b.header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("user B was answered with a replay of user A's answer")
	}
	runA, runB := a.header.Get(proxy.RunIDHeader), b.header.Get(proxy.RunIDHeader)
	if runA == runB {
		t.Fatalf("both users' requests ran as run %s", runA)
	}
	h.settled()
	h.expectCharges(ua.ID, []string{runA})
	h.expectCharges(ub.ID, []string{runB})
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2 (one per user)", n)
	}
}

// TestFingerprintIsScopedToTheUser: the duplicate window compares one user's bodies (DESIGN
// §6: dedup:{user}:...). Two users sending the same prompt at once (a shared template, a
// health check) are two requests: a window shared across users refused the second 409
// duplicate, naming the other user's run. No behaviour test failed when the user was left
// out of the fingerprint's key.
func TestFingerprintIsScopedToTheUser(t *testing.T) {
	h := newHarness(t, nil)
	ua, keyA := h.user("standard")
	ub, keyB := h.user("standard")
	first := make(chan answer, 1)
	go func() { first <- send(h.gw.URL, keyA, chatBody, map[string]string{fakellm.HeaderLatency: "1s"}) }()
	h.waitUpstream(1) // A's call is with the upstream: its fingerprint is taken
	b := sendOK(t, "user B, the body user A is running", h.gw.URL, keyB, chatBody, nil)
	a := <-first
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("user A: %d %v %s", a.status, a.err, a.body)
	}
	h.settled()
	h.expectCharges(ua.ID, []string{a.header.Get(proxy.RunIDHeader)})
	h.expectCharges(ub.ID, []string{b.header.Get(proxy.RunIDHeader)})
}
