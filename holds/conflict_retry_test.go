package holds_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestLockWaitTimeoutIsRetried: a batch whose lock wait times out (a user's row held longer
// than innodb_lock_wait_timeout: an operator's transaction, a stalled grant) is tried again
// under the store's conflict policy, not failed at once: its admission or settlement would
// otherwise be refused, or a settlement left to the reconciler, for one slow lock.
func TestLockWaitTimeoutIsRetried(t *testing.T) {
	ctx := context.Background()
	db, err := holds.Open(ctx, shortLockWaitDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() }) // after the ledger check below
	core, logs := observer.New(zapcore.DebugLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 5, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	u, err := st.CreateUser(ctx, "lock-wait-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	blocker := testenv.ConsoleTx(t, db)
	if _, err := blocker.ExecContext(ctx, "SELECT id FROM users WHERE id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := st.Admit(ctx, holds.AdmitRequest{RunID: "r_waited", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		done <- err
	}()
	// Let the first attempt time out on the lock, then free it for the retry.
	deadline := time.Now().Add(30 * time.Second)
	for logs.FilterMessage("transaction conflict, retrying").Len() == 0 {
		select {
		case err := <-done:
			t.Fatalf("admission behind a held user lock ended before any retry: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no lock wait timeout within 30 s")
		}
	}
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("admission retried after a lock wait timeout: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("admission still waiting 30 s after the lock was freed")
	}
	if _, err := st.Settle(ctx, holds.Settlement{RunID: "r_waited", Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
