package main

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestReconcileLockAndLeaseReadsWithLostReplies: the reconciler's lock (redisLock) and its
// lease reads (leaseChecker) on a network that loses their replies or requests. A lock whose
// reply was lost once is resent and finds itself the holder: the pass goes ahead, not skipped.
// One whose every reply was lost took the lock: the pass is skipped (an error), no other
// process takes the lock meanwhile, so two never scan at once, and the holder's next tick has
// it again. One whose request was lost took nothing: another process may take it. A lease read
// whose reply was lost once is answered by its resend; one that fails is an error, never "not
// leased" (the reconciler then leaves the hold for its next pass).
func TestReconcileLockAndLeaseReadsWithLostReplies(t *testing.T) {
	for _, m := range []struct {
		name  string
		loss  testenv.RedisLoss
		every bool
	}{
		{"reply lost once", testenv.RedisReplyLost, false},
		{"reply lost every attempt", testenv.RedisReplyLost, true},
		{"request lost every attempt", testenv.RedisRequestLost, true},
	} {
		t.Run(m.name, func(t *testing.T) {
			plain, prefix := testenv.Redis(t)
			opt, lossy := testenv.LossyRedisOptions(t)
			rdb := redis.NewClient(opt)
			t.Cleanup(func() { rdb.Close() })
			ctx := context.Background()
			keys := runstate.Keys{Prefix: prefix}
			a := redisLock{rdb: rdb, key: keys.ReconcileLock(), instance: "a", ttl: time.Minute}
			b := redisLock{rdb: plain, key: keys.ReconcileLock(), instance: "b", ttl: time.Minute}
			// The lock script in Redis's cache, as any running gateway has it: it goes as EVALSHA.
			if _, err := (redisLock{rdb: rdb, key: prefix + "warm", instance: "a", ttl: time.Minute}).TryLock(ctx); err != nil {
				t.Fatal(err)
			}
			times := 1
			if m.every {
				times = rdb.Options().MaxRetries + 1
			}
			lossy.Arm(keys.ReconcileLock(), m.loss, times)
			ok, err := a.TryLock(ctx)
			if lossy.Fired() != times {
				t.Fatalf("%d lock writes lost, want %d", lossy.Fired(), times)
			}
			if (err != nil) != m.every || (!m.every && !ok) {
				t.Fatalf("lock with %s: %v, %v", m.name, ok, err)
			}
			landed := m.loss == testenv.RedisReplyLost
			if got, err := b.TryLock(ctx); err != nil || got == landed {
				t.Fatalf("another process's lock after a's that ran %v: %v, %v", landed, got, err)
			}
			if got, err := a.TryLock(ctx); err != nil || got != landed {
				t.Fatalf("a's next lock after its lock that ran %v: %v, %v", landed, got, err)
			}

			lease := keys.Lease("r_leased")
			if err := plain.Set(ctx, lease, "a", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			lossy.Arm(lease, m.loss, times)
			leased, err := leaseChecker{rdb: rdb, keys: keys}.Exists(ctx, "r_leased")
			if lossy.Fired() != times {
				t.Fatalf("%d lease reads lost, want %d", lossy.Fired(), times)
			}
			if (err != nil) != m.every || (!m.every && !leased) {
				t.Fatalf("lease read with %s: leased %v, %v; want leased, or an error", m.name, leased, err)
			}
		})
	}
}
