package holds_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// TestRecordRunCallNotSentIsSafeToSendAgain: a call's record on its run's row that never
// reached the database (its network down before a byte of the statement was written, on a
// pooled connection or a new one) fails as holds.ErrNotSent, changes nothing, and sent again
// once the database is back records the call once. One whose reply was lost is not ErrNotSent:
// its UPDATE ran, and sent again it would count the call twice.
func TestRecordRunCallNotSentIsSafeToSendAgain(t *testing.T) {
	f, lossy, dsn := newLossyFixtureDSN(t)
	t.Cleanup(lossy.Restore) // before the fixture's ledger check, if the test stops with it down
	ctx := context.Background()
	runID := "x_rec_not_sent_" + testenv.RandomID(6)
	f.admit(runID)
	use := pricing.Usage{Input: 10, Output: 2}
	record := func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := f.store.RecordRunCall(rctx, runID, time.Minute, use, 90, 1, false)
		return err
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tcp"
	plain := testenv.Open(t, cfg.FormatDSN()) // the same database around the lossy network
	calls := func() int {
		t.Helper()
		var n int
		if err := plain.Get(&n, "SELECT calls FROM run_holds WHERE run_id = ?", runID); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Recorded once on one connection while another is taken, so that the pool has two idle
	// connections once the test's own statement below has taken the network down with one.
	other, err := f.store.DB().Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := record(); err != nil {
		t.Fatal(err)
	}
	other.Close()

	lossy.Arm("tg-network-down", testenv.GoDown)
	_, _ = f.store.DB().ExecContext(ctx, "SELECT 'tg-network-down'")
	if !lossy.Down() {
		t.Fatal("the network did not go down")
	}
	// The pool's idle connection first (the driver finds it cannot write: driver.ErrBadConn),
	// then new ones (each dial fails): every try is ErrNotSent.
	for i, cause := range []string{"pooled", "dialled", "dialled"} {
		err := record()
		var oe *net.OpError
		if !errors.Is(err, holds.ErrNotSent) || cause == "pooled" && !errors.Is(err, driver.ErrBadConn) ||
			cause == "dialled" && !(errors.As(err, &oe) && oe.Op == "dial") {
			t.Fatalf("record %d with the network down, on a %s connection: %v, want holds.ErrNotSent", i, cause, err)
		}
	}
	if n := calls(); n != 1 {
		t.Fatalf("%d calls recorded after records that were never sent, want the 1 before", n)
	}
	lossy.Restore()
	if err := record(); err != nil {
		t.Fatalf("record sent again once the network is back: %v", err)
	}
	if n := calls(); n != 2 {
		t.Fatalf("%d calls recorded, want 2", n)
	}

	lossy.Arm("ended_calls = ended_calls + 1", testenv.LoseReply)
	err = record()
	if err == nil || errors.Is(err, holds.ErrNotSent) || !lossy.Fired() {
		t.Fatalf("record whose reply was lost: %v (lost: %v), want an error that is not holds.ErrNotSent", err, lossy.Fired())
	}
	if n := calls(); n != 3 {
		t.Fatalf("%d calls recorded after a lost reply, want 3: its UPDATE ran", n)
	}
}

// TestRecordRunCallRefusedReadOnlyUntilItsDeadlineIsNotSent: a call's record refused read_only
// (1792 here, from a session whose transactions are read-only: what a demoted primary's
// read_only answers, 1290, is the same refusal) on every try until its deadline changed
// nothing, so it is ErrNotSent, and sent again once writes are taken it records the call once:
// a failover longer than admit_timeout no longer drops the record.
func TestRecordRunCallRefusedReadOnlyUntilItsDeadlineIsNotSent(t *testing.T) {
	f, _, dsn := newLossyFixtureDSN(t)
	runID := "x_rec_read_only_" + testenv.RandomID(6)
	f.admit(runID)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tcp"
	plain := testenv.Open(t, cfg.FormatDSN())
	cfg.Params = map[string]string{"tx_read_only": "1"}
	readOnly := holds.NewStore(testenv.Open(t, cfg.FormatDSN()), settlePlans, "standard", zap.NewNop())
	// One try, refused, then the deadline during the pause before the next: a deadline that cut
	// a later try's dial would be ErrNotSent for another reason.
	readOnly.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Minute, MaxBackoff: time.Minute})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = readOnly.RecordRunCall(ctx, runID, time.Minute, pricing.Usage{Input: 10, Output: 2}, 90, 1, false)
	var me *mysql.MySQLError
	if !errors.Is(err, holds.ErrNotSent) || !errors.As(err, &me) || me.Number != 1792 {
		t.Fatalf("record refused read_only until its deadline: %v, want holds.ErrNotSent, and the refusal (1792)", err)
	}
	if ok, err := f.store.RecordRunCall(context.Background(), runID, time.Minute, pricing.Usage{Input: 10, Output: 2}, 90, 1, false); err != nil || !ok {
		t.Fatalf("record sent again on a server taking writes: %v, %v", ok, err)
	}
	var calls int
	if err := plain.Get(&calls, "SELECT calls FROM run_holds WHERE run_id = ?", runID); err != nil || calls != 1 {
		t.Fatalf("%d calls recorded (%v), want the one", calls, err)
	}
}
