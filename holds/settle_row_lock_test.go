package holds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestReconcileSettlementReadsTheHoldUnderItsLock: the reconciler settles an expired hold
// only if its expiry, read under the row's lock, has passed. A call's record (RecordRunCall)
// or an extension pushes the expiry out without the user's lock; one still committing when the
// settlement reads the row must be waited for and seen: read without the lock, the settlement
// decided on the expired row, then overwrote the run's recorded call and settled a run whose
// call had just ended well, leaving that call's record out of the charge.
func TestReconcileSettlementReadsTheHoldUnderItsLock(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("row_lock", "standard")
	f.admit(u, "r_row_lock")
	if _, err := f.db.ExecContext(f.ctx(), "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = 'r_row_lock'"); err != nil {
		t.Fatal(err)
	}
	// A call's record, still committing: the row's lock is taken, its new expiry not yet seen.
	rec := testenv.ConsoleTx(t, f.db)
	if _, err := rec.ExecContext(f.ctx(), `UPDATE run_holds SET expires_at = NOW(6) + INTERVAL 1 HOUR,
		cost_micro = cost_micro + 700, calls = calls + 1, ended_calls = ended_calls + 1 WHERE run_id = 'r_row_lock'`); err != nil {
		t.Fatal(err)
	}
	// A connection of its own to watch for the settlement's lock wait.
	obs, err := f.db.Connx(f.ctx())
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	done := make(chan error, 1)
	go func() {
		_, err := f.store.Settle(context.Background(), holds.Settlement{RunID: "r_row_lock", OnlyIfExpired: true,
			Source: holds.SourceRelease})
		done <- err
	}()
	waitLockWaits(t, obs, 1)
	if err := rec.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, holds.ErrRunStillLive) {
		t.Fatalf("reconciler's settlement of a run whose call's record committed meanwhile: %v, want ErrRunStillLive", err)
	}
	r, err := f.store.Run(f.ctx(), u.ID, "r_row_lock")
	if err != nil || r.State == holds.StateSettled || r.CostMicro != 700 {
		t.Fatalf("run %+v, %v: want it live with its call's record", r, err)
	}
	if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: "r_row_lock", CostMicro: 700, Calls: 1, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// waitLockWaits waits, up to a bound, until n transactions on the test's database wait for a
// row lock. InnoDB refreshes innodb_trx only when it has gone unread for 0.1 s: polled
// faster, it never shows the wait.
func waitLockWaits(t *testing.T, obs *sqlx.Conn, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		var waiting int
		if err := obs.GetContext(ctx, &waiting, `SELECT COUNT(*) FROM information_schema.innodb_trx t
			JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
			WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()`); err != nil {
			t.Fatalf("waiting for %d lock waits: %v", n, err)
		}
		if waiting >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d transactions waiting for a lock: %v", waiting, n, ctx.Err())
		case <-time.After(200 * time.Millisecond): // InnoDB refreshes innodb_trx only when unread for 0.1 s
		}
	}
}
