package main

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestRedisLock: one holder at a time; the holder keeps (and refreshes) its lock when it asks
// again; the lock lapses on its own when its holder stops asking (a killed process).
func TestRedisLock(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	key := runstate.Keys{Prefix: prefix}.ReconcileLock()
	// Long enough that no pause of a busy machine lets a's lock lapse between its steps.
	a := redisLock{rdb: rdb, key: key, instance: "a", ttl: 3 * time.Second}
	b := redisLock{rdb: rdb, key: key, instance: "b", ttl: 3 * time.Second}
	try := func(l redisLock) bool {
		t.Helper()
		ok, err := l.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !try(a) {
		t.Fatal("a could not take a free lock")
	}
	if try(b) {
		t.Fatal("b took a's lock")
	}
	// Asking again refreshes the lock: its time to live is back near the full TTL.
	if err := rdb.PExpire(ctx, key, time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if !try(a) {
		t.Fatal("a lost its own lock on asking again")
	}
	if left := rdb.PTTL(ctx, key).Val(); left <= time.Second {
		t.Fatalf("lock has %v left after its holder asked again, want it refreshed to about 3 s", left)
	}
	if v := rdb.Get(ctx, key).Val(); v != "a" {
		t.Fatalf("lock value %q, want the holder's instance", v)
	}
	// a stops asking: its lock lapses and b gets it. Poll with a deadline, no fixed sleep.
	deadline := time.Now().Add(10 * time.Second)
	for !try(b) {
		if time.Now().After(deadline) {
			t.Fatal("a's lock never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if try(a) {
		t.Fatal("a took b's lock")
	}
}
