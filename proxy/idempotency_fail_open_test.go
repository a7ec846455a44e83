package proxy_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemRetryWithRecordUnreadableUnderFailOpen: Redis is out of reach of a gateway that runs
// with dedup.fail_open, and keys used before are retried there. Neither attempt is running, so
// neither retry may be told 409 request_in_progress (to be retried, "still running") for as
// long as Redis is out: the key whose attempt answered 200 is not run again (503, retried once
// Redis is back, when its answer is replayed), and the key whose attempt failed upstream runs
// as its next attempt, as fail_open lets a request through. Each is charged once.
func TestIdemRetryWithRecordUnreadableUnderFailOpen(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	done := map[string]string{proxy.IdempotencyKeyHeader: "fail-open-done"}
	failed := map[string]string{proxy.IdempotencyKeyHeader: "fail-open-failed"}
	first := send(h.gw.URL, key, chatBody, done)
	broken := send(h.gw.URL, key, chatBody, with(failed, fakellm.HeaderStatus, "500"))
	if first.status != http.StatusOK || broken.status != http.StatusBadGateway {
		t.Fatalf("first attempts: %d and %d, want 200 and 502", first.status, broken.status)
	}
	h.settled()
	calls := h.fake.Calls()

	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { dead.Close() })
	srv, open := h.secondGateway(dead, func(c *config.Config) { c.Dedup.FailOpen = true })

	again := send(open, key, chatBody, done)
	if again.status != http.StatusServiceUnavailable || errorCode(t, again.body) != "dedup_unavailable" ||
		again.header.Get("Retry-After") == "" {
		t.Fatalf("retry of the answered key: %d %v %s, want 503 dedup_unavailable with Retry-After", again.status, again.header, again.body)
	}
	if n := h.fake.Calls(); n != calls {
		t.Fatalf("%d upstream calls after the answered key's retry, want %d", n, calls)
	}
	retry := send(open, key, chatBody, failed)
	if retry.status != http.StatusOK || retry.header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("retry of the failed key: %d %v %s, want it run as the next attempt", retry.status, retry.header, retry.body)
	}
	if retry.header.Get(proxy.RunIDHeader) == broken.header.Get(proxy.RunIDHeader) {
		t.Fatalf("the retry ran as the failed attempt's run %s", retry.header.Get(proxy.RunIDHeader))
	}
	waitSettlements(t, srv)
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader), retry.header.Get(proxy.RunIDHeader)}, holds.SourceUpstreamError)
}

// TestIdemSettledAttemptPassedOnlyUnderFailOpen: a retry finds its key's attempt settled
// under it (the attempt failed upstream, and its move to the next attempt never reached the
// record), and the record's second read, to see whether the attempt had pinned the key, fails.
// Without dedup.fail_open the gateway does not go on without the record: 503
// dedup_unavailable, the upstream not called. Passed over as fail_open passes it, the key ran
// its next attempt with its record unread, the refusal the first read makes lifted by the second.
func TestIdemSettledAttemptPassedOnlyUnderFailOpen(t *testing.T) {
	reads := &failingNthWrite{marker: []byte("\r\nlarge_why\r\n"), nth: 2} // readIdem alone asks for it
	h := newHarnessOn(t, harnessSetup{
		redisDialer:     wrappedDialer(func(c net.Conn) net.Conn { return &failingNthWriteConn{Conn: c, f: reads} }),
		contextTimeouts: true,
	}, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "settled-unread"}
	first := send(h.gw.URL, key, chatBody, with(idem, fakellm.HeaderStatus, "500"))
	if first.status != http.StatusBadGateway {
		t.Fatalf("first attempt: %d %s, want 502", first.status, first.body)
	}
	h.settled()
	// The attempt's end, moving the key to its next attempt, is lost: the record says attempt 0.
	record := h.keys.Replay(proxy.IdempotentRunID(u.ID, "settled-unread", 0))
	if err := h.rdb.HDel(context.Background(), record, "attempt").Err(); err != nil {
		t.Fatal(err)
	}
	reads.n.Store(0) // the retry's first read goes through, its second fails
	h.postRefused(t, key, "/v1/chat/completions", chatBody, idem, http.StatusServiceUnavailable, "dedup_unavailable")
	if n := reads.n.Load(); n != 2 {
		t.Fatalf("%d reads of the record, want 2: the retry's, and the one after its attempt was found settled", n)
	}
}

// TestIdemRecordUnreadableFailsClosed: a gateway that does not fail open (dedup.fail_open off,
// the default) whose read of a key's record fails does not go on without it: 503
// dedup_unavailable with Retry-After, nothing held, the upstream not called. Gone on as fail_open
// goes on, from attempt 0 with the record unread, a retry of a key whose answer the record
// holds ran the key again beside it and was charged twice — what an operator who left fail_open
// off chose not to risk. Once the record reads again, the key runs, once.
func TestIdemRecordUnreadableFailsClosed(t *testing.T) {
	h, reads := newRecordReadsHarness(t, false)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "unreadable-closed"}
	reads.on.Store(true)
	resp := h.post(key, "/v1/chat/completions", chatBody, idem)
	resp.Body.Close()
	if ra := resp.Header.Get("Retry-After"); resp.StatusCode != http.StatusServiceUnavailable || ra == "" {
		t.Fatalf("record unreadable, fail_open off: %d Retry-After %q; want 503 with Retry-After", resp.StatusCode, ra)
	}
	// want 503 dedup_unavailable, nothing held, the upstream not called
	h.postRefused(t, key, "/v1/chat/completions", chatBody, idem, http.StatusServiceUnavailable, "dedup_unavailable")
	reads.on.Store(false)
	ran := sendOK(t, "the key once its record reads", h.gw.URL, key, chatBody, idem)
	h.settled()
	h.expectCharges(u.ID, []string{ran.header.Get(proxy.RunIDHeader)})
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want the one run after the record read again", n)
	}
}

// newRecordReadsHarness is a harness whose reads of Idempotency-Key records fail while
// reads.on is set (readIdem alone asks for the large_why field), with dedup.fail_open as given.
func newRecordReadsHarness(t *testing.T, failOpen bool) (*harness, *failingWrites) {
	t.Helper()
	reads := &failingWrites{marker: []byte("\r\nlarge_why\r\n")}
	h := newHarnessOn(t, harnessSetup{
		redisDialer:     wrappedDialer(func(c net.Conn) net.Conn { return &failingWritesConn{Conn: c, f: reads} }),
		contextTimeouts: true,
	}, func(c *config.Config) { c.Dedup.FailOpen = failOpen })
	return h, reads
}
