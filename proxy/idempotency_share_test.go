package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemAnswersKeptPerCallerAreBounded: each Idempotency-Key answer is kept in Redis for
// replay_ttl (a day), up to max_replay_len. A caller sending every request under a new key kept
// one answer per call, with nothing bounding their sum: cheap answers (embeddings, a megabyte
// for a few tokens) filled Redis — which must not evict — at the caller's request rate, until
// it refused every write of every caller's money path. Past the caller's share (derived:
// 64 answers of max_replay_len) an answer is served and charged as any other but not kept: a
// retry of its key is answered 409 with its run, and not run again.
func TestIdemAnswersKeptPerCallerAreBounded(t *testing.T) {
	const maxReplay = 512
	const share = 64 * maxReplay // dedup.max_replay_bytes_per_caller left 0: derived
	h := newHarness(t, func(c *config.Config) { c.Dedup.MaxReplayLen = maxReplay })
	_, key := h.user("standard")
	const calls = 100 // answers of about 460 bytes: past the share
	var last answer
	for i := range calls {
		last = sendOK(t, fmt.Sprintf("call %d", i), h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: fmt.Sprint("share-", i)})
	}
	h.settled()

	ctx := context.Background()
	recs, err := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err != nil || len(recs) != calls {
		t.Fatalf("%d replay records (%v), want one per key, %d", len(recs), err, calls)
	}
	// What the share bounds is Redis's memory, so the records are weighed as Redis weighs
	// them (every field sampled), not by their answers' bytes alone.
	var kept, answers int64
	for _, rec := range recs {
		m, err := h.rdb.HGetAll(ctx, rec).Result()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m["resp"]; !ok {
			continue
		}
		answers++
		n, err := h.rdb.MemoryUsage(ctx, rec, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		kept += n
	}
	if kept > share || kept < share/2 || answers == 0 {
		t.Fatalf("the caller's %d kept answers take %d bytes of Redis; want its share, %d, more than half full and not passed", answers, kept, share)
	}
	all, err := h.rdb.Keys(ctx, h.keys.Prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range all {
		if ttl, err := h.rdb.PTTL(ctx, k).Result(); err != nil || ttl <= 0 {
			t.Errorf("key %s left without a TTL (%v, %v)", k, ttl, err)
		}
	}

	upstream := h.fake.Calls()
	retry := send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: fmt.Sprint("share-", calls-1)})
	if retry.err != nil || retry.status != http.StatusConflict || !strings.Contains(string(retry.body), "idempotent_response_too_large") {
		t.Fatalf("retry of a key whose answer was not kept: %d %v %s; want 409 idempotent_response_too_large", retry.status, retry.err, retry.body)
	}
	if got := errorRunID(t, retry.body); got != last.header.Get(proxy.RunIDHeader) {
		t.Fatalf("409 names run %s, want the attempt that ran, %s", got, last.header.Get(proxy.RunIDHeader))
	}
	if n := h.fake.Calls(); n != upstream {
		t.Fatalf("upstream calls %d -> %d: the key's attempt already ran", upstream, n)
	}
}
