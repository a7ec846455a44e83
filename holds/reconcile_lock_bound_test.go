package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// hungLock is a reconcile lock whose store never answers: TryLock returns only when its
// context ends.
type hungLock struct{}

func (hungLock) TryLock(ctx context.Context) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

// TestReconcileLockWaitIsBounded: a pass whose lock request Redis never answers gives up
// within the lock's own bound, and the next tick tries again. The request ran on the
// reconciler's context alone: with a Redis client without a read timeout of its own
// (read_timeout=-1 in REDIS_URL) one hung request stopped this process's reconciler for good.
func TestReconcileLockWaitIsBounded(t *testing.T) {
	e := newStoreEnv(t)
	rec := e.reconciler("hung", func(c *holds.ReconcilerConfig) { c.Lock = hungLock{} })
	done := make(chan error, 1)
	go func() {
		_, err := rec.RunOnce(context.Background())
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a pass whose lock was never answered reported no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a pass waited over 10 s for a lock request that was never answered")
	}
}
