package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestReadOnlyRefusalsAreTheStoresWhateverTheDSNSaysOfRejectReadOnly: the driver's
// rejectReadOnly=true (its README's advice for failovers) answers a statement refused read_only
// (1290, 1792) as driver.ErrBadConn, a connection found broken before anything was sent. The
// store then no longer knew the refusal for one: a batch's retries drew the pool's other
// connections to the demoted server one by one (each refused, none closed with it:
// TestReadOnlyConnectionsLeaveThePool), and a user's creation, which waits out a refusal
// read_only but never sends again a statement that may have landed, was answered the error at
// once. Open sets it back to false, as it does clientFoundRows.
func TestReadOnlyRefusalsAreTheStoresWhateverTheDSNSaysOfRejectReadOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RejectReadOnly = true
	db := testenv.Open(t, cfg.FormatDSN())
	core, logs := observer.New(zapcore.WarnLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	u, err := st.CreateUser(ctx, "ro-reject-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("batch", func(t *testing.T) {
		demote(ctx, t, db, 8)
		before := logs.FilterMessage("database unavailable, retrying").Len()
		run := "r_ro_reject_" + testenv.RandomID(4)
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := st.Admit(actx, holds.AdmitRequest{RunID: run, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
			t.Fatalf("admission with the pool's connections read-only and a new one writable: %v; want it served on a new connection", err)
		}
		if n := logs.FilterMessage("database unavailable, retrying").Len() - before; n != 1 {
			t.Errorf("admission tried again %d times; want once: the pool's other read-only connections closed at the first refusal", n)
		}
		if _, err := st.Settle(ctx, holds.Settlement{RunID: run, CostMicro: 2_000, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
		checkPoolWritable(ctx, t, db)
	})
	t.Run("user creation", func(t *testing.T) {
		demote(ctx, t, db, 8)
		if _, err := st.CreateUser(ctx, "ro-reject-new-"+testenv.RandomID(3), "standard"); err != nil {
			t.Fatalf("user created with the pool's connections read-only and a new one writable: %v; want it created on a new connection", err)
		}
		checkPoolWritable(ctx, t, db)
	})
}
