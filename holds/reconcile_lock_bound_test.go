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

// slowLock is a reconcile lock taken the moment it is asked for, whose reply comes late (a
// Redis answering slowly): it remembers when it was taken.
type slowLock struct {
	reply time.Duration
	taken chan time.Time
}

func (l slowLock) TryLock(ctx context.Context) (bool, error) {
	l.taken <- time.Now()
	select {
	case <-time.After(l.reply):
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// TestReconcilePassEndsWithinItsBoundFromTheLock: a pass ends within its budget and one hold's
// item timeout of when its lock was taken, which is what the lock's life is sized by (DESIGN
// §5: a second process must not scan beside it) — also when the lock's reply came late and
// when a read of expired holds stalls (a table locked by a long ALTER or a backup). The
// bound was counted from after the lock's reply, and the scan's reads ran on the reconciler's
// context alone: such a stall kept the pass going, lock lapsed, for as long as it lasted.
func TestReconcilePassEndsWithinItsBoundFromTheLock(t *testing.T) {
	e := newStoreEnv(t)
	const budget, item, reply = 100 * time.Millisecond, 1500 * time.Millisecond, 300 * time.Millisecond
	lock := slowLock{reply: reply, taken: make(chan time.Time, 1)}
	rec := e.reconciler("stalled", func(c *holds.ReconcilerConfig) { c.Lock, c.PassBudget = lock, budget })
	rec.SetItemTimeout(item)

	ctx := e.ctx()
	conn, err := e.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "LOCK TABLES run_holds WRITE"); err != nil {
		t.Fatal(err)
	}
	// The table stays locked until the pass has returned: a pass that waited out the stalled
	// read would never return, and only the watchdog, which fails the test, frees the table.
	// The pass returning while the table is still locked is what shows it ended on its bound.
	const watchdog = 15 * time.Second // ten times the bound (budget + item, 1.6 s)
	returned := make(chan struct{})
	unlocked := make(chan struct{})
	go func() {
		defer close(unlocked)
		select {
		case <-returned:
		case <-time.After(watchdog):
			t.Errorf("pass still running %v after it began, its table locked: it waited out the stalled read (bound: budget %v + item %v from the lock)",
				watchdog, budget, item)
		}
		if _, err := conn.ExecContext(context.Background(), "UNLOCK TABLES"); err != nil {
			t.Error(err)
		}
	}()
	defer func() { <-unlocked }()

	st, err := rec.RunOnce(ctx)
	ended := time.Now()
	close(returned)
	taken := <-lock.taken
	if !st.Locked {
		t.Fatalf("pass %+v, %v: want it to hold the lock", st, err)
	}
	if err == nil {
		t.Errorf("a pass whose read of expired holds was cut at its bound reported no error")
	}
	t.Logf("pass ended %v after its lock was taken (bound: budget %v + item %v)", ended.Sub(taken), budget, item)
}
