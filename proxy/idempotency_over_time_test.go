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

// expireIdemRecord puts the key's one record and its attempt run (firstRun) past replay_ttl
// (30 min in these tests) without waiting: the attempt began and settled 31 min ago by the
// database clock, and its record is gone, as Redis expires it.
func expireIdemRecord(t *testing.T, h *harness, firstRun string) {
	t.Helper()
	if _, err := h.db.Exec(`UPDATE run_holds SET created_at = created_at - INTERVAL 31 MINUTE,
		settled_at = settled_at - INTERVAL 31 MINUTE WHERE run_id = ?`, firstRun); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.Exec(`UPDATE usage_days d JOIN run_holds h ON h.user_id = d.user_id AND h.run_id = ?
		SET d.day = DATE(h.settled_at)`, firstRun); err != nil {
		t.Fatal(err)
	}
	deleteIdemRecords(t, h)
}

func deleteIdemRecords(t *testing.T, h *harness) {
	t.Helper()
	ctx := context.Background()
	recs, err := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err != nil || len(recs) != 1 {
		t.Fatalf("idempotency records %v, %v; want one", recs, err)
	}
	if err := h.rdb.Del(ctx, recs...).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestIdemKeyReusedWithAnotherBodyAfterItsWindowRuns: once replay_ttl has passed, a key is a
// new request's, whatever its body (Stripe: keys may be reused after 24 h): the other body
// runs, is charged, pins the key in turn; the first body under it is then 422.
func TestIdemKeyReusedWithAnotherBodyAfterItsWindowRuns(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Dedup.ReplayTTL = 30 * time.Minute })
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "reused-after-window"}
	a := sendOK(t, "first", h.gw.URL, key, chatBody, idem)
	h.settled()
	expireIdemRecord(t, h, a.header.Get(proxy.RunIDHeader))
	b := send(h.gw.URL, key, streamBody, idem)
	h.settled()
	if b.status != http.StatusOK || b.header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("another body under the key after its window: %d replayed=%q %s; want it run", b.status, b.header.Get(proxy.ReplayedHeader), b.body)
	}
	if c := send(h.gw.URL, key, streamBody, idem); c.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(c.body, b.body) {
		t.Fatalf("its retry: %d replayed=%q; want the second answer replayed byte for byte", c.status, c.header.Get(proxy.ReplayedHeader))
	}
	if d := send(h.gw.URL, key, chatBody, idem); d.status != http.StatusUnprocessableEntity {
		t.Fatalf("the first body under the key pinned by the second: %d %s; want 422", d.status, d.body)
	}
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2", n)
	}
	h.expectCharges(u.ID, []string{a.header.Get(proxy.RunIDHeader), b.header.Get(proxy.RunIDHeader)})
}

// TestIdemRecordExpiringUnderARunningAttemptNeverRunsItTwice: replay_ttl shorter than a call,
// or Redis losing the record, leaves a running attempt without its record — here attempt 1,
// after attempt 0 failed upstream. A retry then walks the attempts from 0 by their rows and
// finds attempt 1's live hold: 409 request_in_progress, no second upstream call. Once the
// attempt ends it pins the record again, and the retry is its replay.
func TestIdemRecordExpiringUnderARunningAttemptNeverRunsItTwice(t *testing.T) {
	h, gate := gatedHarness(t, func(c *config.Config) { c.Dedup.ReplayTTL = 30 * time.Minute })
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "expires-while-running"}
	failed := send(h.gw.URL, key, streamBody, map[string]string{proxy.IdempotencyKeyHeader: "expires-while-running",
		fakellm.HeaderStatus: "500"})
	if failed.status == http.StatusOK {
		t.Fatalf("attempt 0: %d, want the upstream's failure", failed.status)
	}
	h.settled()
	// Attempt 1 stays mid-stream at the upstream (gateUpstream) until the retries are answered:
	// a stream of a fixed 4 s could end before a slow machine's retries had walked the attempts.
	held, letGo := heldMidStream(t, gate, "attempt 1", slowStream(200, idem))
	resp := h.post(key, "/v1/chat/completions", streamBody, held)
	br := firstEvent(t, resp)
	deleteIdemRecords(t, h)
	for range 2 { // the second reads the record the first's walk wrote
		if r := send(h.gw.URL, key, streamBody, idem); r.status != http.StatusConflict || errorCode(t, r.body) != "request_in_progress" {
			t.Fatalf("retry while attempt 1 runs without its record: %d %s; want 409 request_in_progress", r.status, r.body)
		}
	}
	letGo()
	rest := readAll(t, br)
	resp.Body.Close()
	h.settled()
	r := send(h.gw.URL, key, streamBody, idem)
	if r.header.Get(proxy.ReplayedHeader) != "true" || !bytes.HasSuffix(r.body, rest) {
		t.Fatalf("retry after attempt 1 ended: %d replayed=%q %s; want its answer replayed", r.status, r.header.Get(proxy.ReplayedHeader), r.body)
	}
	if n := gate.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2 (attempt 0 and attempt 1)", n)
	}
	h.expectCharges(u.ID, []string{resp.Header.Get(proxy.RunIDHeader)}, "upstream_error")
}

// TestIdemStreamReplayedByteForByteAfterARestart: the stored answer lives in Redis, not in the
// process: a gateway started after the one that streamed it replays the whole stream, byte for
// byte, with its run id, and charges nothing.
func TestIdemStreamReplayedByteForByteAfterARestart(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "replay-after-restart"}
	a := send(h.gw.URL, key, streamBody, idem)
	if a.status != http.StatusOK || !bytes.Contains(a.body, []byte("[DONE]")) {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	h.settled()
	h.gw.Close() // the first process is gone
	_, next := h.secondGateway(nil, nil)
	r := send(next, key, streamBody, idem)
	if r.status != http.StatusOK || r.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(r.body, a.body) ||
		r.header.Get(proxy.RunIDHeader) != a.header.Get(proxy.RunIDHeader) || r.header.Get("Content-Type") != a.header.Get("Content-Type") {
		t.Fatalf("replay after a restart: %d replayed=%q run %q type %q, equal %t; want the stream byte for byte",
			r.status, r.header.Get(proxy.ReplayedHeader), r.header.Get(proxy.RunIDHeader), r.header.Get("Content-Type"), bytes.Equal(r.body, a.body))
	}
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
	h.expectCharges(u.ID, []string{a.header.Get(proxy.RunIDHeader)})
}
