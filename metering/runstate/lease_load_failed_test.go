package runstate_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestLeaseReleasedWhileABeatFailsToLoadItsScriptIsDeleted: a heartbeat takes a run, and
// before it sends anything the run's last call ends, its release failing (a Redis blip); then
// the beat's own first step, loading its script, fails too. The beat must still delete the
// key of the run it took and no longer holds, as it does when its writes fail: else the
// lease, written by an earlier beat, stays for a whole lease TTL, the run looking served by a
// live process (its settle 409 run_busy, the reconciler extending it).
func TestLeaseReleasedWhileABeatFailsToLoadItsScriptIsDeleted(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := context.Background()
	rdb := redis.NewClient(base.Options())
	t.Cleanup(func() { rdb.Close() })
	var l *runstate.Leases
	var releaseErr error
	h := &failScripts{onLoad: func() { releaseErr = l.Release(ctx, "x_load") }}
	rdb.AddHook(h)
	l = runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())
	l.Acquire("x_load")
	if err := l.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if n := base.Exists(ctx, keys.Lease("x_load")).Val(); n != 1 {
		t.Fatal("the first beat wrote no lease: nothing tested")
	}
	h.armed.Store(true)
	if err := l.Refresh(ctx); err == nil {
		t.Fatal("beat whose script load failed reported no error")
	}
	if releaseErr == nil {
		t.Fatal("the release during the beat did not fail: nothing tested")
	}
	if ttl := base.PTTL(ctx, keys.Lease("x_load")).Val(); ttl != -2 {
		t.Fatalf("the released run's lease stays (for %v): its run looks served by a live process", ttl)
	}
}

// failScripts, once armed, fails the next SCRIPT LOAD, running onLoad first with every script
// command failing.
type failScripts struct {
	armed   atomic.Bool
	failing atomic.Bool
	onLoad  func()
}

var errBlip = errors.New("redis blip (test)")

func (h *failScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch name := cmd.Name(); {
		case h.failing.Load() && (name == "eval" || name == "evalsha"):
			cmd.SetErr(errBlip)
			return errBlip
		case name == "script" && h.armed.CompareAndSwap(true, false):
			h.failing.Store(true)
			h.onLoad()
			h.failing.Store(false)
			cmd.SetErr(errBlip)
			return errBlip
		}
		return next(ctx, cmd)
	}
}
func (h *failScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
