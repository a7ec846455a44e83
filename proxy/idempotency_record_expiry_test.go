package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemAnswerPinnedOverALostRecordLapsesWithReplayTTL: an answer that pins its key keeps
// the record dedup.replay_ttl from the pin, whatever became of the record its admission
// started. Redis lost that record while the call ran (a restart without persistence, an
// eviction): the pin writes it anew, and it must expire like any other. Written without an
// expiry, the key replayed that answer, and refused any other body 422, for good, and the
// record held Redis memory no bound counts.
func TestIdemAnswerPinnedOverALostRecordLapsesWithReplayTTL(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	ctx := context.Background()
	const idemKey = "pinned-over-lost-record"
	hdr := map[string]string{proxy.IdempotencyKeyHeader: idemKey}
	first := make(chan answer, 1)
	go func() { first <- send(h.gw.URL, key, chatBody, with(hdr, "X-Test-Gate", "call")) }()
	defer gate.open("call")
	gate.await(t, "call", 1)
	runID := proxy.IdempotentRunID(u.ID, idemKey, 0)
	rec := h.keys.Replay(runID)
	if n, err := h.rdb.Del(ctx, rec).Result(); err != nil || n != 1 {
		t.Fatalf("deleting the running attempt's record %s: %d %v, want the record there to lose", rec, n, err)
	}
	gate.open("call")
	a := <-first
	if a.status != http.StatusOK || a.header.Get(proxy.RunIDHeader) != runID {
		t.Fatalf("call: %d run %q %s, want 200 as %s", a.status, a.header.Get(proxy.RunIDHeader), a.body, runID)
	}
	h.settled()
	if run, err := h.rdb.HGet(ctx, rec, "run").Result(); err != nil || run != runID {
		t.Fatalf("record %s after the answer: run %q (%v), want the key pinned on %s", rec, run, err, runID)
	}
	ttl, err := h.rdb.PTTL(ctx, rec).Result()
	if replayTTL := h.cfg.Dedup.ReplayTTL; err != nil || ttl <= 0 || ttl > replayTTL {
		t.Fatalf("record pinned over a lost one lives %v (%v; -1 is no expiry), want at most replay_ttl (%v)", ttl, err, replayTTL)
	}
	again := send(h.gw.URL, key, chatBody, hdr)
	if again.status != http.StatusOK || again.header.Get(proxy.ReplayedHeader) != "true" || string(again.body) != string(a.body) {
		t.Fatalf("retry: %d replayed=%q %s; want the pinned answer replayed", again.status, again.header.Get(proxy.ReplayedHeader), again.body)
	}
	h.expectCharges(u.ID, []string{runID})
	if n := gate.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls for one key, want 1", n)
	}
}

// TestIdemMovePastAFailedAttemptOverALostRecordLapsesWithReplayTTL: as
// TestIdemAnswerPinnedOverALostRecordLapsesWithReplayTTL, for an attempt that does not pin its
// key (its upstream failed): its end moves the key to the next attempt in a record written anew
// over the one Redis lost while it ran, and that record too lives dedup.replay_ttl from the
// move. Written without an expiry, the record of a key never retried stayed in Redis for good,
// memory no bound counts, and its counter outlived replay_ttl.
func TestIdemMovePastAFailedAttemptOverALostRecordLapsesWithReplayTTL(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	ctx := context.Background()
	const idemKey = "moved-over-lost-record"
	hdr := map[string]string{proxy.IdempotencyKeyHeader: idemKey}
	first := make(chan answer, 1)
	go func() {
		first <- send(h.gw.URL, key, chatBody, with(with(hdr, "X-Test-Gate", "call"), fakellm.HeaderStatus, "500"))
	}()
	defer gate.open("call")
	gate.await(t, "call", 1)
	rec := h.keys.Replay(proxy.IdempotentRunID(u.ID, idemKey, 0))
	if n, err := h.rdb.Del(ctx, rec).Result(); err != nil || n != 1 {
		t.Fatalf("deleting the running attempt's record %s: %d %v, want the record there to lose", rec, n, err)
	}
	gate.open("call")
	if a := <-first; a.status != http.StatusBadGateway {
		t.Fatalf("call: %d %s, want 502 (the upstream failed)", a.status, a.body)
	}
	h.settled()
	if attempt, err := h.rdb.HGet(ctx, rec, "attempt").Result(); err != nil || attempt != "1" {
		t.Fatalf("record %s after the failed attempt: attempt %q (%v), want the key moved to attempt 1", rec, attempt, err)
	}
	ttl, err := h.rdb.PTTL(ctx, rec).Result()
	if replayTTL := h.cfg.Dedup.ReplayTTL; err != nil || ttl <= 0 || ttl > replayTTL {
		t.Fatalf("record moved past a failed attempt over a lost one lives %v (%v; -1 is no expiry), want at most replay_ttl (%v)",
			ttl, err, replayTTL)
	}
	next := sendOK(t, "retry", h.gw.URL, key, chatBody, hdr)
	if want := proxy.IdempotentRunID(u.ID, idemKey, 1); next.header.Get(proxy.RunIDHeader) != want {
		t.Fatalf("retry ran as %q, want attempt 1 (%s)", next.header.Get(proxy.RunIDHeader), want)
	}
	h.settled()
	h.expectCharges(u.ID, []string{next.header.Get(proxy.RunIDHeader)}, holds.SourceUpstreamError)
}
