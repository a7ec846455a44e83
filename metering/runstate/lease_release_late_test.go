package runstate_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestLeaseReleasedDuringASlowBeatIsDeleted: a run's lease is released while a heartbeat's
// SET of it is on its way, and Redis answers that SET only after the beat's deadline (one beat
// interval). The SET lands after the release's DEL, so the beat must delete the key again: it
// did so on the beat's own context, already ended, and the key stayed for lease_ttl — the run
// looked served by a live process (its settle answered 409 run_busy, the reconciler extended
// it instead of settling).
func TestLeaseReleasedDuringASlowBeatIsDeleted(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	// The first write naming the lease is the beat's SET of it (the release comes after).
	hold := testenv.NewHeldWrite(keys.Lease("x_slow_beat"))
	rdb := redisThrough(t, base, func(c net.Conn) net.Conn { return &testenv.HoldingConn{Conn: c, Hold: hold} })
	leases := runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())
	warmUp(t, leases)
	leases.Acquire("x_slow_beat")

	beat, cancel := context.WithTimeout(context.Background(), beatDeadline)
	defer cancel()
	refreshed := make(chan error, 1)
	go func() { refreshed <- leases.Refresh(beat) }()
	select {
	case <-hold.Held(): // the beat's SET is on its way
	case err := <-refreshed:
		t.Fatalf("the beat ended (%v) before its write of the lease was sent: nothing tested", err)
	}
	if err := leases.Release(context.Background(), "x_slow_beat"); err != nil {
		t.Fatal(err)
	}
	<-beat.Done() // the beat's deadline has passed
	hold.Let()    // the SET reaches Redis now, after the release
	if err := <-refreshed; err == nil {
		t.Fatal("a beat answered after its deadline reported no error")
	}
	if n := base.Exists(context.Background(), keys.Lease("x_slow_beat")).Val(); n != 0 {
		ttl := base.PTTL(context.Background(), keys.Lease("x_slow_beat")).Val()
		t.Fatalf("the released run's lease is still there (for %v more): its run looks served by a live process", ttl)
	}
}

// beatDeadline is the deadline of a beat whose write is held: the write must be sent within it,
// after the client's connection is dialled and the beat's script loaded (200 ms was at times
// too short for that on a loaded machine, and the test then hung or saw nothing held).
const beatDeadline = time.Second

// warmUp runs one beat and release of a run of its own through leases, so that the test's beat
// finds its client's connection dialled and its script loaded, and spends its deadline on the
// write the test holds.
func warmUp(t *testing.T, leases *runstate.Leases) {
	t.Helper()
	ctx := context.Background()
	leases.Acquire("x_warm_up")
	if err := leases.Refresh(ctx); err != nil {
		t.Fatalf("warm-up beat: %v", err)
	}
	if err := leases.Release(ctx, "x_warm_up"); err != nil {
		t.Fatalf("warm-up release: %v", err)
	}
}

// redisThrough is a client of base's server whose connections go through wrap, and whose
// commands end at their context's deadline alone (read_timeout=-1 in REDIS_URL): a reply that
// never comes is waited for as long as the caller's context allows.
func redisThrough(t *testing.T, base *redis.Client, wrap func(net.Conn) net.Conn) *redis.Client {
	t.Helper()
	opt := *base.Options()
	opt.ContextTimeoutEnabled = true
	opt.ReadTimeout = -1
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrap(c), nil
	}
	rdb := redis.NewClient(&opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestLeaseBeatDeliveredAfterTheReleaseWritesNothing: a heartbeat's write of a run's lease
// reaches Redis only after the beat gave up on it (a delayed packet, past the beat's deadline
// and its drop of released runs, which found the run still held), and after the run's last
// call here released it. It must not put the lease back: it did, for a whole lease TTL, the
// run looking served by a live process (its settle 409 run_busy, the reconciler extending it).
func TestLeaseBeatDeliveredAfterTheReleaseWritesNothing(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	opt, lossy := testenv.LossyRedisOptions(t)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	leases := runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())
	warmUp(t, leases)
	leases.Acquire("x_late_beat")
	lossy.Arm(keys.Lease("x_late_beat"), testenv.RedisWriteLate, 1)
	beat, cancel := context.WithTimeout(context.Background(), beatDeadline)
	err := leases.Refresh(beat)
	cancel()
	if err == nil || lossy.Fired() != 1 {
		t.Fatalf("beat whose write was held: %v, %d held; want an error, one held", err, lossy.Fired())
	}
	if err := leases.Release(context.Background(), "x_late_beat"); err != nil {
		t.Fatal(err)
	}
	lossy.AwaitLate().Deliver()
	if ttl := base.PTTL(context.Background(), keys.Lease("x_late_beat")).Val(); ttl != -2 {
		t.Fatalf("the released run's lease is back (for %v): its run looks served by a live process", ttl)
	}
}

// TestLeaseBeatDeliveredLateAfterAFailedReleaseAndANewCallWritesNothing: a heartbeat's write of
// a run's lease is on its way late; the run's last call here ends and its release fails (every
// attempt lost), and the run's next call here starts before the beat gives up, so the beat's
// drop of released runs finds the run held and deletes nothing. The next call's release must
// still outdate that beat: it outdated none (its lease had no beat of its own), and the late
// write then put the lease back for a whole lease TTL, the run looking served by a live
// process (its settle 409 run_busy, the reconciler extending it).
func TestLeaseBeatDeliveredLateAfterAFailedReleaseAndANewCallWritesNothing(t *testing.T) {
	ctx := context.Background()
	const run = "x_late_beat_new_call"
	base, keys, rdb, lossy, leases := lossyLeases(t, run)
	refreshed, late := beatHeldLate(t, leases, lossy, keys.Lease(run))
	// The release names the run's released beats alone among these writes.
	lossy.Arm(keys.LeaseReleased(run), testenv.RedisRequestLost, rdb.Options().MaxRetries+1)
	if err := leases.Release(ctx, run); err == nil {
		t.Fatalf("a release whose every attempt was lost reported no error (%d lost)", lossy.Fired())
	}
	lossy.Disarm()
	leases.Acquire(run) // the run's next call here
	if err := <-refreshed; err == nil {
		t.Fatal("a beat whose write was held late reported no error")
	}
	if base.HExists(ctx, keys.LeaseReleased(run), "process-a").Val() {
		t.Fatal("the beat's drop ran before the run's next call began: nothing tested")
	}
	if err := leases.Release(ctx, run); err != nil {
		t.Fatal(err)
	}
	late.Deliver()
	if ttl := base.PTTL(ctx, keys.Lease(run)).Val(); ttl != -2 {
		t.Fatalf("the released run's lease is back (for %v): its run looks served by a live process", ttl)
	}
}

// TestLeaseReleaseOutdatesItsBeatForALeaseTTL: the record a release leaves of the beats it
// outdated (leaserel) is needed only as long as a beat's write could still come, a lease TTL,
// and must lapse then: without its expiry it stayed for good, one key per run ever leased.
func TestLeaseReleaseOutdatesItsBeatForALeaseTTL(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := context.Background()
	const run, ttl = "x_leaserel_lapses", time.Minute
	leases := runstate.NewLeases(rdb, keys, "process-a", ttl, time.Second, zap.NewNop())
	leases.Acquire(run)
	if err := leases.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, run); err != nil {
		t.Fatal(err)
	}
	if !rdb.HExists(ctx, keys.LeaseReleased(run), "process-a").Val() {
		t.Fatal("the release outdated no beat: nothing tested")
	}
	if got := rdb.PTTL(ctx, keys.LeaseReleased(run)).Val(); got <= 0 || got > ttl {
		t.Fatalf("the release's record of outdated beats lives %v; want it to lapse within the lease TTL (%v)", got, ttl)
	}
}

// TestLeaseBeatDeliveredLateAfterAReleaseAndALostDropWritesNothing: a heartbeat's write of a
// run's lease is on its way late; the run's last call here releases it meanwhile, and the
// beat's drop of released runs, once it gives up, is lost. The release itself must outdate the
// beat on its way (the beat took the run before it was sent): else the late write, finding
// nothing outdated, put the lease back for a whole lease TTL.
func TestLeaseBeatDeliveredLateAfterAReleaseAndALostDropWritesNothing(t *testing.T) {
	ctx := context.Background()
	const run = "x_late_beat_lost_drop"
	base, keys, rdb, lossy, leases := lossyLeases(t, run)
	if err := leases.Refresh(ctx); err != nil { // an earlier beat, so the late one is not the first
		t.Fatal(err)
	}
	refreshed, late := beatHeldLate(t, leases, lossy, keys.Lease(run))
	if err := leases.Release(ctx, run); err != nil {
		t.Fatal(err)
	}
	// The beat's drop names the run's released beats; the release has been answered already.
	lossy.Arm(keys.LeaseReleased(run), testenv.RedisRequestLost, rdb.Options().MaxRetries+1)
	if err := <-refreshed; err == nil {
		t.Fatal("a beat whose write was held late reported no error")
	}
	if lossy.Fired() == 0 {
		t.Fatal("the beat's drop was not lost: nothing tested")
	}
	lossy.Disarm()
	late.Deliver()
	if ttl := base.PTTL(ctx, keys.Lease(run)).Val(); ttl != -2 {
		t.Fatalf("the released run's lease is back (for %v): its run looks served by a live process", ttl)
	}
}

// TestLeaseBeatDeliveredLateAfterAFailedReleaseIsOutdatedByItsDrop: a heartbeat's write of a
// run's lease is on its way late; the run's last call here releases it and that release is
// lost. The beat's drop of released runs, once it gives up, finds the run released and must
// outdate the beat it belongs to: else the late write, finding nothing outdated, put the lease
// back for a whole lease TTL.
func TestLeaseBeatDeliveredLateAfterAFailedReleaseIsOutdatedByItsDrop(t *testing.T) {
	ctx := context.Background()
	const run = "x_late_beat_lost_release"
	base, keys, rdb, lossy, leases := lossyLeases(t, run)
	refreshed, late := beatHeldLate(t, leases, lossy, keys.Lease(run))
	lossy.Arm(keys.LeaseReleased(run), testenv.RedisRequestLost, rdb.Options().MaxRetries+1)
	if err := leases.Release(ctx, run); err == nil {
		t.Fatalf("a release whose every attempt was lost reported no error (%d lost)", lossy.Fired())
	}
	lossy.Disarm()
	if err := <-refreshed; err == nil {
		t.Fatal("a beat whose write was held late reported no error")
	}
	late.Deliver()
	if ttl := base.PTTL(ctx, keys.Lease(run)).Val(); ttl != -2 {
		t.Fatalf("the released run's lease is back (for %v): its run looks served by a live process", ttl)
	}
}

// lossyLeases is process-a's leases through a LossyRedis, holding run; base reads the same
// Redis unharmed.
func lossyLeases(t *testing.T, run string) (base *redis.Client, keys runstate.Keys, rdb *redis.Client, lossy *testenv.LossyRedis, leases *runstate.Leases) {
	t.Helper()
	base, prefix := testenv.Redis(t)
	keys = runstate.Keys{Prefix: prefix}
	opt, lossy := testenv.LossyRedisOptions(t)
	rdb = redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	leases = runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())
	leases.Acquire(run)
	return base, keys, rdb, lossy, leases
}

// beatHeldLate starts a heartbeat (a second's deadline) whose write of lease is held on its
// way, and returns once it is: refreshed gets the beat's outcome, late delivers the write.
func beatHeldLate(t *testing.T, leases *runstate.Leases, lossy *testenv.LossyRedis, lease string) (refreshed chan error, late *testenv.LateWrite) {
	t.Helper()
	lossy.Arm(lease, testenv.RedisWriteLate, 1)
	beat, cancel := context.WithTimeout(context.Background(), time.Second)
	t.Cleanup(cancel)
	refreshed = make(chan error, 1)
	go func() { refreshed <- leases.Refresh(beat) }()
	return refreshed, lossy.AwaitLate()
}
