package proxy

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/tollgate/metering/runstate"
	"go.uber.org/zap"
)

// TestCancelBusDoesNotHoldRunsBehindASubscription: while the bus waits on Redis to subscribe
// (here a Redis that never answers), a run can still be unregistered and a cancel delivered
// to a registered one; and once the attempt has failed, the next session requests learn it
// at once instead of each waiting out an attempt of its own in turn.
func TestCancelBusDoesNotHoldRunsBehindASubscription(t *testing.T) {
	entered, release := make(chan struct{}, 16), make(chan struct{})
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1,
		Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) {
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, errors.New("redis down")
		}})
	t.Cleanup(func() { rdb.Close() })
	b := newCancelBus(rdb, runstate.Keys{}, time.Minute, zap.NewNop())
	b.retryAfter = time.Hour // the fail-fast window outlasts the test however slow the machine

	started := make(chan error, 1)
	go func() { started <- b.start(context.Background()) }()
	<-entered // the subscription is waiting on Redis

	cancelled := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.mu.Lock() // as register does once start returns
		b.runs["r_live"] = cancellable{cancel: func(err error) { cancelled <- err }, log: zap.NewNop()}
		b.mu.Unlock()
		b.unregister("r_gone")
		b.deliver("r_live")
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("unregister and delivery waited behind the subscription")
	}
	if err := <-cancelled; !errors.Is(err, errSuperseded) {
		t.Fatalf("cancel delivered with %v", err)
	}
	close(release)
	if err := <-started; err == nil {
		t.Fatal("subscription to a Redis that is down reported success")
	}
	for len(entered) > 0 { // the failed attempt's own dials (the client may try more than one)
		<-entered
	}
	for range 5 {
		if err := b.start(context.Background()); !errors.Is(err, errBusDown) {
			t.Fatalf("start right after a failed one: %v, want errBusDown", err)
		}
	}
	if n := len(entered); n != 0 {
		t.Fatalf("%d more dials to Redis within the retry pause", n)
	}
}
