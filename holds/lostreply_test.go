package holds_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// commitScript is what only the closing script of a batch contains.
const commitScript = ";\nCOMMIT"

// newLossyFixture is newSettleFixture on a network that can lose MySQL's replies.
func newLossyFixture(t *testing.T) (*settleFixture, *testenv.Lossy) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db, err := holds.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	u, err := st.CreateUser(context.Background(), "lossy-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	return &settleFixture{t: t, store: st, user: u}, lossy
}

// holdRows counts a run's rows and returns its state.
func holdRows(t *testing.T, st *holds.Store, runID string) (int, string) {
	t.Helper()
	var rows []string
	if err := st.DB().Select(&rows, "SELECT state FROM run_holds WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		return 0, ""
	}
	return len(rows), rows[0]
}

// TestLostCommitReplyIsClaimedByTheRetry: the server commits an admission but its reply is
// lost with the connection. The retry must find that hold and hand it to its caller — a
// refusal would leave a hold nobody releases, which the reconciler would charge — whether
// the run id was fresh or named.
func TestLostCommitReplyIsClaimedByTheRetry(t *testing.T) {
	for _, fresh := range []bool{true, false} {
		name := map[bool]string{true: "fresh run id", false: "named run"}[fresh]
		t.Run(name, func(t *testing.T) {
			f, lossy := newLossyFixture(t)
			ctx := context.Background()
			run := "r_lost_" + testenv.RandomID(4)
			lossy.Arm(commitScript, testenv.LoseReply)
			h, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: f.user.ID, State: holds.StateRunning,
				TTL: time.Minute, Fresh: fresh})
			if err != nil || h.Existing || h.HeldMicro != 20_000 {
				t.Fatalf("admission whose commit reply was lost: %+v, %v; want its own new hold", h, err)
			}
			if n, state := holdRows(t, f.store, run); n != 1 || state != string(holds.StateRunning) {
				t.Fatalf("%d rows for the run, state %q", n, state)
			}
			if res, err := f.store.Settle(ctx, holds.Settlement{RunID: run, CostMicro: 3_000, Source: holds.SourceComplete}); err != nil || !res.Applied {
				t.Fatalf("settle the claimed hold: %+v, %v", res, err)
			}
		})
	}
}

// TestLostCommitReplyOfASettlementChargesOnce: a settlement whose commit reply is lost is
// retried; the retry finds the run settled and changes nothing.
func TestLostCommitReplyOfASettlementChargesOnce(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	f.admit("r_lost_settle")
	lossy.Arm(commitScript, testenv.LoseReply)
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_lost_settle", CostMicro: 7_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	if bal, err := f.store.Balance(ctx, f.user.ID); err != nil || bal.UsedTodayMicro != 7_000 || bal.InFlight != 0 {
		t.Fatalf("balance %+v, %v: want one charge of 7,000", bal, err)
	}
}

// TestWriteScriptOutlivesTheBatchDeadline: a batch's deadline passing while its writes and
// COMMIT are on the wire must not abandon them: the caller learns the outcome the database
// reached, here a committed hold.
func TestWriteScriptOutlivesTheBatchDeadline(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: testenv.LossyWait / 2, SettleTimeout: 10 * time.Second})
	defer w.Close()
	lossy.Arm(commitScript, testenv.LateReply)
	h, err := w.Admit(ctx, holds.AdmitRequest{RunID: "r_late_commit", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
	if err != nil {
		t.Fatalf("admission whose commit outlived the deadline: %v", err)
	}
	if n, state := holdRows(t, f.store, h.RunID); n != 1 || state != string(holds.StateRunning) {
		t.Fatalf("%d rows for the run, state %q", n, state)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: h.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
