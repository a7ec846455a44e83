package runstate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// A heartbeat has until the next one's time (heartbeat_interval) for all its round trips, and a
// process with more calls in flight than one pipeline takes (refreshBatch, 500) sends several.
// Sent one after another, a Redis answering each a little late — every reply, not one — ran the
// beat past its deadline with the later pipelines unsent, and since every beat stopped at the
// same point, the calls beyond it were never stamped while their process was alive and
// beating: their leases lapsed after lease_ttl (the reconciler then takes a call past its hold
// for a killed one's), and their named runs' reservations went stale and were dropped by the
// run's next call (the run's cap no longer counted them). The batches go out together: a beat
// costs the same few round trips however many calls it stamps.

// slowBeat is the setting of these tests: each reply slowBy late, a beat's time interval, and
// enough calls for many pipelines, so that one after another they need far more than the
// interval and together far less. The calls fill one round of the pipelines a beat sends at
// once (refreshParallel, 8, of 500). Together they cost a few late replies and the CPU of
// stamping each call: about 6 s for the leases (the script's load, the new connections'
// greeting, the pipelines, the drop of released runs), 4 s for the reservations; one after
// another, over 20 s and 10 s. (At 300 ms late, a 3 s interval for both and 6000 calls in two
// rounds, a loaded machine under -race took 2.5 s of the 3 s for a beat, and at times more:
// both tests failed with nothing wrong.)
const (
	slowBy                  = time.Second
	slowCalls               = 4000
	slowLeaseInterval       = 10 * time.Second
	slowReservationInterval = 7 * time.Second
)

// TestLeaseBeatBehindASlowRedisWritesEveryLease: one beat, behind a Redis whose every reply is
// slowBy late, writes the lease of each of slowCalls calls within its interval.
func TestLeaseBeatBehindASlowRedisWritesEveryLease(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	slow := &testenv.Slow{Min: slowBy, Max: slowBy}
	opt := *base.Options()
	opt.ContextTimeoutEnabled = true
	opt.Dialer = slow.Dial
	rdb := redisThroughOptions(t, &opt)

	leases := runstate.NewLeases(rdb, keys, "process-slow", 3*slowLeaseInterval, slowLeaseInterval, zap.NewNop())
	for i := range slowCalls {
		leases.Acquire(fmt.Sprintf("r_slow_%d", i))
	}
	// One beat, as the heartbeat sends it: on a deadline of its interval.
	ctx, cancel := context.WithTimeout(context.Background(), slowLeaseInterval)
	err := leases.Refresh(ctx)
	cancel()
	if err != nil {
		t.Errorf("a beat of %d leases behind replies %v late: %v", slowCalls, slowBy, err)
	}
	written := 0
	for i := range slowCalls {
		if base.Exists(context.Background(), keys.Lease(fmt.Sprintf("r_slow_%d", i))).Val() == 1 {
			written++
		}
	}
	if written != slowCalls {
		t.Fatalf("one beat wrote %d of %d leases behind replies %v late, within its %v: the others lapse while their process lives",
			written, slowCalls, slowBy, slowLeaseInterval)
	}
}

// TestReservationBeatBehindASlowRedisStampsEveryReservation: one beat, behind a Redis whose every
// reply is slowBy late, stamps each of slowCalls named-run reservations within its interval.
func TestReservationBeatBehindASlowRedisStampsEveryReservation(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	slow := &testenv.Slow{Min: slowBy, Max: slowBy}
	slow.Off.Store(true)
	opt := *base.Options()
	opt.ContextTimeoutEnabled = true
	opt.Dialer = slow.Dial
	rdb := redisThroughOptions(t, &opt)

	b := runstate.NewRunBudget(rdb, keys, time.Hour, time.Hour, 3*slowReservationInterval)
	ctx := context.Background()
	for i := range slowCalls {
		if _, err := b.Reserve(ctx, fmt.Sprintf("r_slow_%d", i%100), fmt.Sprintf("c_%d", i), 1_000_000_000, 1_000, 1); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]string{}
	for i := range 100 {
		for f, v := range base.HGetAll(ctx, keys.RunBudget(fmt.Sprintf("r_slow_%d", i))).Val() {
			before[fmt.Sprintf("%d/%s", i, f)] = v
		}
	}
	time.Sleep(2 * time.Millisecond) // the stamps are Redis's milliseconds: a new one differs
	slow.Off.Store(false)
	bctx, cancel := context.WithTimeout(ctx, slowReservationInterval)
	lost, err := b.Refresh(bctx)
	cancel()
	if err != nil || len(lost) != 0 {
		t.Errorf("a beat of %d reservations behind replies %v late: lost %d, %v", slowCalls, slowBy, len(lost), err)
	}
	slow.Off.Store(true)
	stamped := 0
	for i := range 100 {
		for f, v := range base.HGetAll(ctx, keys.RunBudget(fmt.Sprintf("r_slow_%d", i))).Val() {
			if old, ok := before[fmt.Sprintf("%d/%s", i, f)]; ok && len(f) > 2 && f[:2] == "c:" && v != old {
				stamped++
			}
		}
	}
	if stamped != slowCalls {
		t.Fatalf("one beat stamped %d of %d reservations behind replies %v late, within its %v: the others go stale while their calls run",
			stamped, slowCalls, slowBy, slowReservationInterval)
	}
}

// redisThroughOptions is a client on opt, closed at the test's end.
func redisThroughOptions(t *testing.T, opt *redis.Options) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
