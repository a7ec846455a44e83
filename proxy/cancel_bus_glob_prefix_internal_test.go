package proxy

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestCancelBusHearsCancelsUnderAPrefixWithGlobCharacters: the bus subscribes to every run's
// cancel channel with one pattern built from redis_key_prefix, which config accepts with any
// bytes in it. A prefix holding a glob character of Redis's (here "[eu]", a region tag, and a
// backslash) made the pattern match other channels than the gateway's own: PUBLISH reached no
// subscriber, and a session run replaced by a newer message on another process ran on, charged,
// until the session check found it. The prefix is now matched literally.
func TestCancelBusHearsCancelsUnderAPrefixWithGlobCharacters(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	for _, tag := range []string{"[eu]:", `a\b:`, "*?:"} {
		keys := runstate.Keys{Prefix: prefix + tag}
		b := newCancelBus(rdb, keys, time.Minute, zap.NewNop())
		t.Cleanup(func() { _ = b.close() })
		run := "r_" + testenv.RandomID(16)
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		if err := b.register(ctx, run, cancel, zap.NewNop()); err != nil {
			t.Fatalf("prefix %q: register: %v", keys.Prefix, err)
		}
		// Another process's publish: PUBLISH answers how many subscribers it reached.
		n, err := rdb.Publish(context.Background(), keys.Cancel(run), "superseded").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n < 1 {
			t.Fatalf("prefix %q: the cancel of %s reached %d subscribers: the bus's pattern does not match its own channels", keys.Prefix, run, n)
		}
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("prefix %q: a cancel that reached the bus did not stop its run", keys.Prefix)
		}
		if cause := context.Cause(ctx); !errors.Is(cause, errSuperseded) {
			t.Fatalf("prefix %q: run stopped with %v", keys.Prefix, cause)
		}
	}
}
