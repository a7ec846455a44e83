package proxy_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemEmptyBrokenStreamRuns: a stream the upstream broke before any output does not pin its
// key (README): the retry runs as the next attempt, not replayed. Pinned, the caller's every
// retry for replay_ttl was the same empty, broken stream, and the request could not be had
// under its key at all.
func TestIdemEmptyBrokenStreamRuns(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first := send(h.gw.URL, key, streamBody, map[string]string{proxy.IdempotencyKeyHeader: "broken-early-kept",
		fakellm.HeaderChunks: "20", fakellm.HeaderDropAfter: "0"})
	if first.status != http.StatusOK || !bytes.Contains(first.body, []byte("upstream_broken")) {
		t.Fatalf("first: %d %s; want a stream broken before any output", first.status, first.body)
	}
	h.settled()
	retry := send(h.gw.URL, key, streamBody, map[string]string{proxy.IdempotencyKeyHeader: "broken-early-kept"})
	h.settled()
	if retry.status != http.StatusOK || retry.header.Get(proxy.ReplayedHeader) != "" || !bytes.Contains(retry.body, []byte("[DONE]")) {
		t.Fatalf("retry of an empty broken stream: %d replayed=%q %s; want it run", retry.status, retry.header.Get(proxy.ReplayedHeader), retry.body)
	}
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2 (the broken attempt and its retry)", n)
	}
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader), retry.header.Get(proxy.RunIDHeader)})
}
