package holds_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestLockWaitTimeoutInTheClosingScriptChargesOnce: a batch's closing script times out on a
// lock (1205) at its last write, the new hold's insert, after it marked its holds settled,
// added to the day ledgers and took prepaid credits. Unlike a deadlock, a lock wait timeout
// rolls back only the statement (innodb_rollback_on_timeout is off): the transaction, its
// other writes and its user locks stay open until the batch rolls it back. The retry must find
// nothing of the first attempt: each settlement charged once, prepaid taken once, one hold.
func TestLockWaitTimeoutInTheClosingScriptChargesOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := testenv.Open(t, shortLockWaitDSN(t))
	core, logs := observer.New(zapcore.DebugLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 5, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	var users [2]holds.User
	for i := range users {
		u, err := st.CreateUser(ctx, "closing-wait-"+testenv.RandomID(3), "standard")
		if err != nil {
			t.Fatal(err)
		}
		// A small allowance: the charges below come mostly out of prepaid credits.
		allowance := int64(1_000)
		if err := st.SetUserLimits(ctx, u.ID, &allowance, nil, nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.Grant(ctx, holds.GrantRequest{UserID: u.ID, AmountMicro: 1_000_000, IdempotencyKey: "closing-wait-" + testenv.RandomID(6)}); err != nil {
			t.Fatal(err)
		}
		users[i] = u
	}
	a, b := users[0], users[1]
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	runA, runB := "r_cw_a_"+testenv.RandomID(4), "r_cw_b_"+testenv.RandomID(4)
	mustAdmit(ctx, t, st, a.ID, runA)
	mustAdmit(ctx, t, st, b.ID, runB)
	newA := "r_cw_new_" + testenv.RandomID(4)

	// The other transaction inserts the new hold's key first, uncommitted: the batch's insert
	// waits on it, its other writes done.
	other := testenv.ConsoleTx(t, db)
	if _, err := other.ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, expires_at)
		VALUES (?, ?, 'running', 0, 0, NOW(6))`, newA, b.ID); err != nil {
		t.Fatal(err)
	}
	type out struct {
		settled  []holds.BatchResult
		admitted []holds.AdmitResult
		err      error
	}
	done := make(chan out, 1)
	go func() {
		s, ad, err := st.WriteBatch(ctx,
			[]holds.Settlement{{RunID: runA, CostMicro: 7_000, Source: holds.SourceComplete}, {RunID: runB, CostMicro: 9_000, Source: holds.SourceComplete}},
			[]holds.AdmitRequest{{RunID: newA, UserID: a.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}})
		done <- out{s, ad, err}
	}()
	for logs.FilterMessage("transaction conflict, retrying").Len() == 0 {
		select {
		case o := <-done:
			t.Fatalf("batch ended before any lock wait timed out: %+v", o)
		case <-ctx.Done():
			t.Fatal("no lock wait timeout")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := other.Rollback(); err != nil {
		t.Fatal(err)
	}
	first := logs.FilterMessage("transaction conflict, retrying").All()[0].ContextMap()["error"]
	if s, _ := first.(string); !strings.Contains(s, "write and commit") || !strings.Contains(s, "1205") {
		t.Fatalf("the first attempt failed with %v; want a lock wait timeout (1205) in its closing script", first)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("batch after a lock wait timeout in its closing script: %v", o.err)
	}
	for i, r := range o.settled {
		if r.Err != nil || !r.Applied {
			t.Fatalf("settlement %d: %+v", i, r)
		}
	}
	if r := o.admitted[0]; r.Err != nil || r.Hold.HeldMicro != 20_000 {
		t.Fatalf("admission: %+v", r)
	}
	for _, c := range []struct {
		u       holds.User
		run     string
		charged int64
	}{{a, runA, 7_000}, {b, runB, 9_000}} {
		var n int
		var charged int64
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE run_id = ? AND state = 'settled'", c.run).Scan(&n, &charged); err != nil || n != 1 || charged != c.charged {
			t.Fatalf("%s: %d settled rows charged %d, %v; want one charged %d", c.run, n, charged, err, c.charged)
		}
		var used, prepaid int64
		// Every day's row: a settlement at 23:59:59.9 read at 00:00:00.1 is on yesterday's.
		if err := db.QueryRowContext(ctx, `SELECT (SELECT CAST(COALESCE(SUM(used_micro), 0) AS SIGNED) FROM usage_days WHERE user_id = u.id),
			u.prepaid_micro FROM users u WHERE u.id = ?`, c.u.ID).Scan(&used, &prepaid); err != nil {
			t.Fatal(err)
		}
		if used != c.charged || prepaid != 1_000_000-(c.charged-1_000) {
			t.Fatalf("user %d: ledger %d, prepaid %d; want %d and %d", c.u.ID, used, prepaid, c.charged, 1_000_000-(c.charged-1_000))
		}
	}
	if n, state := holdRows(t, st, newA); n != 1 || state != string(holds.StateRunning) {
		t.Fatalf("%s: %d rows, state %q; want one live hold", newA, n, state)
	}
	if _, err := st.Settle(ctx, holds.Settlement{RunID: newA, Source: holds.SourceRelease}); err != nil {
		t.Fatal(err)
	}
}
