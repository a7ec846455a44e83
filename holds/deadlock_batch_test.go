package holds_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestDeadlockedBatchOfSeveralUsersRetriesEachItemOnce: a batch carrying two users'
// settlements and admissions for a third user and for one of the first two is chosen as a
// deadlock's victim in its closing script — after it marked its holds settled and added to one
// user's day ledger, waiting on the other's — by a transaction that holds that ledger row and
// then asks for the first user's row. InnoDB rolls the whole batch back (1213): it is tried
// again, and every item ends exactly once — each settlement charged once, each admission one
// hold — with the day ledger equal to the charges.
func TestDeadlockedBatchOfSeveralUsersRetriesEachItemOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The other transaction locks b's row of the day the first settlements made: past a
	// midnight in between it would lock none, and no deadlock would come. The day stands still.
	db := testenv.MySQLMidday(t)
	// The store's own log says which of its transactions a deadlock rolled back: the server's
	// Innodb_deadlocks counts every test's, in every package sharing this server.
	core, logs := observer.New(zap.DebugLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	var users [4]holds.User // a, b, c; d only weighs the other transaction down
	for i := range users {
		u, err := st.CreateUser(ctx, "deadlock-"+testenv.RandomID(3), "standard")
		if err != nil {
			t.Fatal(err)
		}
		users[i] = u
	}
	a, b, c, d := users[0], users[1], users[2], users[3]
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	// Both settling users have today's ledger row.
	for _, u := range []holds.User{a, b} {
		run := "r_dl_first_" + testenv.RandomID(4)
		mustAdmit(ctx, t, st, u.ID, run)
		if _, err := st.Settle(ctx, holds.Settlement{RunID: run, CostMicro: 1_000, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	runA, runB := "r_dl_a_"+testenv.RandomID(4), "r_dl_b_"+testenv.RandomID(4)
	mustAdmit(ctx, t, st, a.ID, runA)
	mustAdmit(ctx, t, st, b.ID, runB)
	newA, newC := "r_dl_new_a_"+testenv.RandomID(4), "r_dl_new_c_"+testenv.RandomID(4)

	// The other transaction: heavier than the batch (InnoDB rolls back the one that changed
	// fewer rows), holding b's ledger row.
	other := testenv.ConsoleTx(t, db)
	for day := 1; day <= 50; day++ {
		if _, err := other.ExecContext(ctx, "INSERT INTO usage_days (user_id, day, used_micro) VALUES (?, CURRENT_DATE - INTERVAL ? DAY, 0)", d.ID, day); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.ExecContext(ctx, "SELECT user_id FROM usage_days WHERE user_id = ? AND day = UTC_DATE() FOR UPDATE", b.ID); err != nil {
		t.Fatal(err)
	}
	obs, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	type out struct {
		settled  []holds.BatchResult
		admitted []holds.AdmitResult
		err      error
	}
	done := make(chan out, 1)
	go func() {
		s, ad, err := st.WriteBatch(ctx,
			[]holds.Settlement{{RunID: runA, CostMicro: 7_000, Source: holds.SourceComplete}, {RunID: runB, CostMicro: 9_000, Source: holds.SourceComplete}},
			[]holds.AdmitRequest{{RunID: newC, UserID: c.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true},
				{RunID: newA, UserID: a.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}})
		done <- out{s, ad, err}
	}()
	lockWaiter(ctx, t, obs) // the batch waits on b's ledger row, holding a's user row
	if _, err := other.ExecContext(ctx, "SELECT id FROM users WHERE id = ? FOR UPDATE", a.ID); err != nil {
		t.Fatalf("the other transaction was the deadlock's victim, not the batch: %v", err)
	}
	if err := other.Rollback(); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("batch chosen as a deadlock's victim: %v; want it tried again", o.err)
	}
	var deadlocked int
	for _, e := range logs.FilterMessage("transaction conflict, retrying").All() {
		if err, ok := e.ContextMap()["error"].(string); ok && strings.Contains(err, "1213") {
			deadlocked++
		}
	}
	if deadlocked != 1 {
		t.Fatalf("the batch was tried again after %d deadlocks (Error 1213), want after the one: %v", deadlocked, logs.All())
	}
	for i, r := range o.settled {
		if r.Err != nil || !r.Applied {
			t.Fatalf("settlement %d: %+v", i, r)
		}
	}
	for i, r := range o.admitted {
		if r.Err != nil || r.Hold.HeldMicro != 20_000 {
			t.Fatalf("admission %d: %+v", i, r)
		}
	}
	for run, want := range map[string]int64{runA: 7_000, runB: 9_000} {
		var n int
		var charged int64
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE run_id = ? AND state = 'settled'", run).Scan(&n, &charged); err != nil || n != 1 || charged != want {
			t.Fatalf("%s: %d settled rows charged %d, %v; want one charged %d", run, n, charged, err, want)
		}
	}
	for _, u := range []holds.User{a, b} {
		used, err := testenv.LedgerUsed(ctx, db, u.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]int64{a.ID: 8_000, b.ID: 10_000}[u.ID]
		if used != want {
			t.Fatalf("user %d's day ledger %d, want %d", u.ID, used, want)
		}
	}
	for _, run := range []string{newA, newC} {
		if n, state := holdRows(t, st, run); n != 1 || state != string(holds.StateRunning) {
			t.Fatalf("%s: %d rows, state %q; want one live hold", run, n, state)
		}
		if _, err := st.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceRelease}); err != nil {
			t.Fatal(err)
		}
	}
}
