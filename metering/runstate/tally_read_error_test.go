package runstate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestTallyReadRefusedForAWhileIsNoCorruptTally: a tally read that Redis refuses with an error
// of its own other than WRONGTYPE (a replica loading its data after a restart, a failover under
// way) is a failed read, to be asked again, not a tally that is no record of usage
// (ErrTallyCorrupt), on which the reconciler charges the run its hold at once.
func TestTallyReadRefusedForAWhileIsNoCorruptTally(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := context.Background()
	const run = "r_loading"
	if err := runstate.NewTally(base, keys, time.Hour).Add(ctx, run, pricing.Usage{Output: 5}, 50, false); err != nil {
		t.Fatal(err)
	}
	if err := runstate.NewTally(base, keys, time.Hour).MarkRefused(ctx, run, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(base.Options())
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(loadingRedis{})
	tally := runstate.NewTally(rdb, keys, time.Hour)
	if _, _, err := tally.Get(ctx, run); err == nil || errors.Is(err, runstate.ErrTallyCorrupt) {
		t.Fatalf("tally read while Redis loads: %v, want a failed read, not ErrTallyCorrupt", err)
	}
	if _, err := tally.Refused(ctx, run, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"); err == nil || errors.Is(err, runstate.ErrTallyCorrupt) {
		t.Fatalf("refusal marks read while Redis loads: %v, want a failed read, not ErrTallyCorrupt", err)
	}
}

// errLoading is Redis's answer while it loads its data set: an error of Redis's (redis.Error).
type errLoading struct{}

func (errLoading) Error() string { return "LOADING Redis is loading the dataset in memory" }
func (errLoading) RedisError()   {}

// loadingRedis answers every command, in a pipeline too, as a Redis loading its data set does.
type loadingRedis struct{}

func (loadingRedis) DialHook(next redis.DialHook) redis.DialHook { return next }
func (loadingRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		cmd.SetErr(errLoading{})
		return cmd.Err()
	}
}
func (loadingRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			cmd.SetErr(errLoading{})
		}
		return errLoading{}
	}
}
