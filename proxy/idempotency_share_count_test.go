package proxy_test

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemAnswerKeptWhenItsCallersCountFails: the count of a caller's kept answers
// (dedup.max_replay_bytes_per_caller) failed, and the answer's record write after it, to the same
// Redis, went through. The count is a bound on Redis's memory, not part of the answer's
// promise: its failure keeps the answer all the same, and the retry is replayed — not told
// 409 that the caller's kept answers were full, when nothing said they were.
func TestIdemAnswerKeptWhenItsCallersCountFails(t *testing.T) {
	count := &failingWrites{}
	h := newHarnessOn(t, harnessSetup{
		redisDialer:     wrappedDialer(func(c net.Conn) net.Conn { return &failingWritesConn{Conn: c, f: count} }),
		contextTimeouts: true,
	}, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "count-fails"}
	count.marker = []byte("\r\n" + h.keys.ReplayBytes(u.ID) + "\r\n") // the count's script alone names it
	count.on.Store(true)
	first := sendOK(t, "first attempt", h.gw.URL, key, chatBody, idem)
	h.settled()
	count.on.Store(false)

	calls := h.fake.Calls()
	again := send(h.gw.URL, key, chatBody, idem)
	if again.status != http.StatusOK || again.header.Get(proxy.ReplayedHeader) != "true" || string(again.body) != string(first.body) {
		t.Fatalf("retry: %d replayed=%q %s; want the first answer replayed", again.status, again.header.Get(proxy.ReplayedHeader), again.body)
	}
	if n := h.fake.Calls(); n != calls {
		t.Fatalf("upstream calls %d -> %d: the key's attempt already ran", calls, n)
	}
}

// TestIdemCallersCountHoldsAnAnswerForItsReplayTTL: a caller's count of kept answers is kept
// in time buckets of replay_ttl/ReplayBuckets. An answer counted in the bucket ReplayBuckets
// before the current one was stored less than replay_ttl ago, may still be kept, and counts;
// one a bucket older has surely expired, and no longer counts. The count itself lives at
// least as long as the answers it counts. Dropped a bucket early, a caller's answers still
// kept went uncounted and the caller kept more than its share; kept a bucket late, the caller
// was refused room its expired answers no longer took.
func TestIdemCallersCountHoldsAnAnswerForItsReplayTTL(t *testing.T) {
	const maxReplay, share = 4096, 8192
	const ttl = 24 * time.Hour
	width := (ttl / proxy.ReplayBuckets).Milliseconds()
	h := newHarness(t, func(c *config.Config) {
		c.Dedup.ReplayTTL = ttl
		c.Dedup.MaxReplayLen = maxReplay
		c.Dedup.MaxReplayBytesPerCaller = share
	})
	ctx := context.Background()
	bucket := func() int64 {
		now, err := h.rdb.Time(ctx).Result() // the count's clock: Redis's
		if err != nil {
			t.Fatal(err)
		}
		return now.UnixMilli() / width
	}
	// keptBeside sends a request under a new caller whose count holds a full share, counted
	// back buckets before the current one, and returns whether its answer was kept, and the
	// caller's id.
	keptBeside := func(t *testing.T, back int64) (bool, uint64) {
		for {
			u, key := h.user("standard")
			now := bucket()
			count := h.keys.ReplayBytes(u.ID)
			if err := h.rdb.HSet(ctx, count, strconv.FormatInt(now-back, 10), share).Err(); err != nil {
				t.Fatal(err)
			}
			if err := h.rdb.PExpire(ctx, count, 2*ttl).Err(); err != nil {
				t.Fatal(err)
			}
			a := sendOK(t, "call", h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: "counted"})
			h.settled()
			if bucket() != now {
				continue // a bucket's end passed meanwhile: the count did not see what was planted
			}
			kept, err := h.rdb.HExists(ctx, h.keys.Replay(a.header.Get(proxy.RunIDHeader)), "resp").Result()
			if err != nil {
				t.Fatal(err)
			}
			return kept, u.ID
		}
	}
	t.Run("an answer of the oldest live bucket counts", func(t *testing.T) {
		if kept, _ := keptBeside(t, proxy.ReplayBuckets); kept {
			t.Fatalf("answer kept beside a full share counted %d buckets back, within replay_ttl", proxy.ReplayBuckets)
		}
	})
	t.Run("an answer past replay_ttl no longer counts", func(t *testing.T) {
		kept, userID := keptBeside(t, proxy.ReplayBuckets+1)
		if !kept {
			t.Fatalf("answer refused beside a full share counted %d buckets back, expired", proxy.ReplayBuckets+1)
		}
		if left, err := h.rdb.PTTL(ctx, h.keys.ReplayBytes(userID)).Result(); err != nil || left < ttl {
			t.Fatalf("the caller's count lives %v more (%v); want at least replay_ttl, %v, as the answer it counts", left, err, ttl)
		}
	})
}

// TestIdemAnswerTooLargeToKeepTakesNoShare: an answer past dedup.max_replay_len is not kept,
// so it takes none of its caller's share of kept answers (dedup.max_replay_bytes_per_caller):
// counted, each one refused the caller room for a day that no answer of theirs took.
func TestIdemAnswerTooLargeToKeepTakesNoShare(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Dedup.MaxReplayLen = 64 })
	u, key := h.user("standard")
	a := sendOK(t, "call", h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: "too-large"})
	h.settled()
	ctx := context.Background()
	if large, err := h.rdb.HGet(ctx, h.keys.Replay(a.header.Get(proxy.RunIDHeader)), "large").Result(); err != nil || large != "1" {
		t.Fatalf("record's large %q (%v); want the answer marked too large (the test's sizing is off)", large, err)
	}
	buckets, err := h.rdb.HGetAll(ctx, h.keys.ReplayBytes(u.ID)).Result()
	if err != nil || len(buckets) != 0 {
		t.Fatalf("the caller's kept answers are counted %v (%v); want nothing: its one answer was not kept", buckets, err)
	}
}
