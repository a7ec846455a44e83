package runstate_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestLeaseReleaseKeepsAnotherProcessLease: calls of one named run served by two processes
// both lease it; when the first ends, the lease the second wrote last stays.
func TestLeaseReleaseKeepsAnotherProcessLease(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := context.Background()
	a := runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())
	b := runstate.NewLeases(rdb, keys, "process-b", time.Minute, time.Second, zap.NewNop())
	a.Acquire("x_shared")
	b.Acquire("x_shared")
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil { // b wrote last
		t.Fatal(err)
	}
	if err := a.Release(ctx, "x_shared"); err != nil {
		t.Fatal(err)
	}
	if v := rdb.Get(ctx, keys.Lease("x_shared")).Val(); v != "process-b" {
		t.Fatalf("lease after a's call ended: %q, want b's still there", v)
	}
	if err := b.Release(ctx, "x_shared"); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, keys.Lease("x_shared")).Val(); n != 0 {
		t.Fatal("lease left after the last call of the run ended")
	}
}

// roundTrips counts what a client sends to Redis: each command or pipeline is one round trip.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestLeaseNeverWrittenCostsNoRoundTrip: a call that ends before any heartbeat wrote its lease
// has no key to delete, and its release must not spend a round trip on one (it was a quarter
// of a plain call's round trips to Redis). A lease a heartbeat wrote is still deleted.
func TestLeaseNeverWrittenCostsNoRoundTrip(t *testing.T) {
	base, prefix := testenv.Redis(t)
	rdb := redis.NewClient(base.Options())
	t.Cleanup(func() { rdb.Close() })
	counted := &roundTrips{}
	rdb.AddHook(counted)
	keys := runstate.Keys{Prefix: prefix}
	ctx := context.Background()
	l := runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())

	l.Acquire("r_short")
	l.Acquire("r_short") // two calls of one run
	for range 2 {
		if err := l.Release(ctx, "r_short"); err != nil {
			t.Fatal(err)
		}
	}
	if n := counted.n.Load(); n != 0 {
		t.Fatalf("releasing a lease no heartbeat wrote took %d round trips, want 0", n)
	}

	l.Acquire("r_long")
	if err := l.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if n := base.Exists(ctx, keys.Lease("r_long")).Val(); n != 1 {
		t.Fatal("heartbeat did not write the lease")
	}
	if err := l.Release(ctx, "r_long"); err != nil {
		t.Fatal(err)
	}
	if n := base.Exists(ctx, keys.Lease("r_long")).Val(); n != 0 {
		t.Fatal("lease a heartbeat wrote survived the release of its last call")
	}
	if l.Held() != 0 {
		t.Fatalf("%d leases held after every call ended", l.Held())
	}
}

// TestLeaseAcquiredAgainDuringRefreshIsDeleted: a run released and acquired again during a
// heartbeat is written by the next beat at the latest (the release outdates the beat under way,
// whose write may land after it); when its new call ends the key must go, or a named run looks
// served for a whole lease TTL (its settle refused as busy, the reconciler leaving it alone).
func TestLeaseAcquiredAgainDuringRefreshIsDeleted(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := context.Background()
	rdb := redis.NewClient(base.Options())
	t.Cleanup(func() { rdb.Close() })
	var l *runstate.Leases
	// Between the heartbeat's SETs and its clean-up, the run's call ends and another begins.
	rdb.AddHook(&onPipeline{after: func() {
		if err := l.Release(ctx, "x_run"); err != nil {
			t.Error(err)
		}
		l.Acquire("x_run")
	}})
	l = runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())
	l.Acquire("x_run")
	if err := l.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx); err != nil { // the next beat
		t.Fatal(err)
	}
	if n := base.Exists(ctx, keys.Lease("x_run")).Val(); n != 1 {
		t.Fatal("the run is held again, its lease should be there")
	}
	if err := l.Release(ctx, "x_run"); err != nil {
		t.Fatal(err)
	}
	if n := base.Exists(ctx, keys.Lease("x_run")).Val(); n != 0 {
		t.Fatal("lease left for its TTL after the last call of a run acquired during a heartbeat ended")
	}
}

// onPipeline runs after once, after the first pipeline it sees has been answered.
type onPipeline struct {
	after func()
	done  atomic.Bool
}

func (h *onPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *onPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *onPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.done.CompareAndSwap(false, true) {
			h.after()
		}
		return err
	}
}

// TestLeaseBeatsAreNumberedApartWithinAMillisecond: a release outdates the beat that took its
// run and every earlier one (leaserel), so each beat must be numbered past the last, however
// close they come. Numbered by the clock's millisecond alone, a beat in the millisecond of the
// one a release outdated took its number and wrote nothing: a run taken again at once had no
// lease, its calls unseen by a settle and by the reconciler.
func TestLeaseBeatsAreNumberedApartWithinAMillisecond(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	leases := runstate.NewLeases(rdb, runstate.Keys{Prefix: prefix}, "process-a", time.Minute, time.Second, zap.NewNop())
	last := leases.NextBeat()
	for i := range 1000 { // far more than a millisecond's worth
		b := leases.NextBeat()
		if b <= last {
			t.Fatalf("beat %d numbered %d after %d: a release of the earlier outdates it", i+1, b, last)
		}
		last = b
	}
}

// TestLeaseStaysWhileAnotherCallOfTheRunRuns: calls of one run overlap on a process, and its
// lease is one key; the end of one call must leave the key, written by a heartbeat, while
// another still runs, or the run looks orphaned (its settle not refused busy, the reconciler
// free to settle it) under a running call until the next beat.
func TestLeaseStaysWhileAnotherCallOfTheRunRuns(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := context.Background()
	l := runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())
	l.Acquire("x_two")
	l.Acquire("x_two")
	if err := l.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, "x_two"); err != nil {
		t.Fatal(err)
	}
	if v := rdb.Get(ctx, keys.Lease("x_two")).Val(); v != "process-a" {
		t.Fatalf("lease after the first of two calls ended: %q, want it still there", v)
	}
	if err := l.Release(ctx, "x_two"); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, keys.Lease("x_two")).Val(); n != 0 {
		t.Fatal("lease left after the last call of the run ended")
	}
}
