package runstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestRunCloseDeliveredAfterItsReopenClosesNothing: a settlement's close is held on the network
// past its deadline; the settlement gives up and reopens the run with the close's mark; then the
// close reaches Redis. It must close nothing: it closed the run for the longest call, its calls
// refused as settled after a settle that answered an error, with no one left to reopen it.
func TestRunCloseDeliveredAfterItsReopenClosesNothing(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	opt, lossy := testenv.LossyRedisOptions(t)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	b := runstate.NewRunBudget(rdb, keys, time.Hour, time.Hour, testStaleAfter)
	plain := runstate.NewRunBudget(base, keys, time.Hour, time.Hour, testStaleAfter)
	ctx := context.Background()
	mustClose(t, b, "r_warm_close") // the close goes as EVALSHA, and runs
	const run = "r_close_late"
	lossy.Arm(keys.RunBudget(run), testenv.RedisWriteLate, 1)
	closing, cancel := context.WithTimeout(ctx, beatDeadline)
	mark, err := b.CloseRun(closing, run)
	cancel()
	if err == nil || mark == "" || lossy.Fired() != 1 {
		t.Fatalf("close whose write was held: mark %q, %v, %d held; want its mark, an error, one held", mark, err, lossy.Fired())
	}
	if err := plain.ReopenRun(ctx, run, mark); err != nil {
		t.Fatal(err)
	}
	lossy.AwaitLate().Deliver()
	if base.HExists(ctx, keys.RunBudget(run), "closed").Val() {
		t.Fatal("the close delivered after its reopen closed the run")
	}
	if _, err := plain.Reserve(ctx, run, "a", 10_000, 1_000, 100); err != nil {
		t.Fatalf("reserve after the late close: %v, want the run open", err)
	}
}
