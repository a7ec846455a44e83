package proxy_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemKeyUsableAfterReplayTTL: README: the stored answer is replayed "for
// dedup.replay_ttl". Once that has passed the record is gone because it expired, not because
// Redis lost it: a request under the same key is a new request and must run, not be told
// 409 idempotent_response_lost for ever.
func TestIdemKeyUsableAfterReplayTTL(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Dedup.ReplayTTL = time.Second })
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "daily-job-1"}
	a := sendOK(t, "first", h.gw.URL, key, chatBody, idem)
	h.settled()
	// The record is kept for replay_ttl, no longer; the test waits for it to be gone (and the
	// attempt settled a replay_ttl ago), not for a guess at how long that takes.
	if ttl, err := h.rdb.PTTL(context.Background(), onlyIdemRecord(h)).Result(); err != nil || ttl <= 0 || ttl > time.Second {
		t.Fatalf("the record's time to live %v (%v), want within replay_ttl (1s)", ttl, err)
	}
	waitRecordExpired(t, h, a.header.Get(proxy.RunIDHeader))
	b := send(h.gw.URL, key, chatBody, idem)
	h.settled()
	if b.status != 200 {
		t.Fatalf("a request under a key whose replay_ttl has passed: %d %s; want it run", b.status, b.body)
	}
	// Run, not replayed: a 200 replay of the first answer would pass the check above.
	if r := b.header.Get(proxy.ReplayedHeader); r != "" {
		t.Fatalf("a request under a key whose replay_ttl has passed was replayed (%s %q); want it run", proxy.ReplayedHeader, r)
	}
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2: the request after replay_ttl is a new one", n)
	}
	h.expectCharges(u.ID, []string{a.header.Get(proxy.RunIDHeader), b.header.Get(proxy.RunIDHeader)})
}

// TestIdemBrokenStreamPinnedThenRecordLost: a stream that broke after output pins the
// key (README); if Redis then loses the record, the retry must not run and be charged again,
// as for a complete attempt.
func TestIdemBrokenStreamPinnedThenRecordLost(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first := sendOK(t, "first", h.gw.URL, key, streamBody, map[string]string{proxy.IdempotencyKeyHeader: "broken-late",
		fakellm.HeaderChunks: "20", fakellm.HeaderDropAfter: "5"})
	h.settled()
	// The key is pinned: a retry is a replay.
	r1 := send(h.gw.URL, key, streamBody, map[string]string{proxy.IdempotencyKeyHeader: "broken-late"})
	if r1.header.Get(proxy.ReplayedHeader) != "true" {
		t.Fatalf("retry before the loss: %d %s; want a replay", r1.status, r1.body)
	}
	ctx := context.Background()
	recs, _ := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err := h.rdb.Del(ctx, recs...).Err(); err != nil {
		t.Fatal(err)
	}
	calls := h.fake.Calls()
	r2 := send(h.gw.URL, key, streamBody, map[string]string{proxy.IdempotencyKeyHeader: "broken-late"})
	h.settled()
	if n := h.fake.Calls(); n != calls || r2.status == http.StatusOK {
		t.Fatalf("retry after Redis lost the record of a pinned attempt: %d, upstream calls %d -> %d; want 409 idempotent_response_lost, no new call",
			r2.status, calls, n)
	}
	// Nor charged again: the broken attempt is the user's one charge (the upstream's count alone
	// let a retry charged its hold without being forwarded pass).
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader)})
}

// TestIdemEmptyBrokenStreamThenRecordLostRuns: a stream that broke before any output does not
// pin the key (README); if Redis then loses the record, the attempt's row (settled
// stream_error, no output) says so too, and the retry runs rather than being refused 409
// idempotent_response_lost for the record's replay_ttl.
func TestIdemEmptyBrokenStreamThenRecordLostRuns(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first := send(h.gw.URL, key, streamBody, map[string]string{proxy.IdempotencyKeyHeader: "broken-early",
		fakellm.HeaderChunks: "20", fakellm.HeaderDropAfter: "0"})
	if first.status != http.StatusOK || !bytes.Contains(first.body, []byte("upstream_broken")) {
		t.Fatalf("first: %d %s; want a stream broken before any output", first.status, first.body)
	}
	h.settled()
	ctx := context.Background()
	recs, err := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err != nil || len(recs) != 1 {
		t.Fatalf("idempotency records %v, %v; want one", recs, err)
	}
	if err := h.rdb.Del(ctx, recs...).Err(); err != nil {
		t.Fatal(err)
	}
	retry := send(h.gw.URL, key, streamBody, map[string]string{proxy.IdempotencyKeyHeader: "broken-early"})
	h.settled()
	if retry.status != http.StatusOK || retry.header.Get(proxy.ReplayedHeader) != "" || !bytes.Contains(retry.body, []byte("[DONE]")) {
		t.Fatalf("retry after Redis lost the record of an empty broken stream: %d replayed=%q %s; want it run",
			retry.status, retry.header.Get(proxy.ReplayedHeader), retry.body)
	}
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2 (the broken attempt and its retry)", n)
	}
	// Each attempt is charged what it used: the broken one its prompt.
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader), retry.header.Get(proxy.RunIDHeader)})
}
