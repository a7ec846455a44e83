package runstate_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestHeartbeatSurvivesAHungBeat: a beat that Redis never answers ends at the next beat's
// time, and the beats after it write the leases again once Redis is back. The beat ran on the
// process's context alone: with a Redis client that does not time reads out itself
// (read_timeout=-1 in REDIS_URL) a beat sent while Redis hung never returned, and no lease of
// the process was written again — the reconciler then took its calls in flight for a killed
// process's and charged their holds.
func TestHeartbeatSurvivesAHungBeat(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	var stalled atomic.Bool
	swallowed := make(chan struct{}, 1)
	rdb := redisThrough(t, base, func(c net.Conn) net.Conn {
		return &testenv.StallingConn{Conn: c, Stalled: &stalled, Swallowed: swallowed}
	})

	const interval = 100 * time.Millisecond
	// hang bounds what the test waits for something that, broken, never happens: generous, so a
	// loaded machine cannot trip it; it catches a hang, it does not time the heartbeat.
	const hang = 10 * time.Second
	leases := runstate.NewLeases(rdb, keys, "process-a", time.Second, interval, zap.NewNop())
	leases.Acquire("x_hung")
	stalled.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); leases.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(hang):
			t.Errorf("the heartbeat did not stop within %v of its context's end", hang)
		}
	})

	select { // a beat is sent, and hangs
	case <-swallowed:
	case <-time.After(hang):
		t.Fatalf("no beat sent within %v", hang)
	}
	stalled.Store(false)
	deadline := time.Now().Add(hang)
	for base.Exists(context.Background(), keys.Lease("x_hung")).Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no lease written %v after Redis came back: the hung beat stopped the heartbeat", hang)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
