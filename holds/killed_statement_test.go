package holds_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestBatchStatementKilledByTheServerIsRetried: the server ends a batch's statement without
// ending its connection — an operator's KILL QUERY of a statement waiting on a lock (pt-kill
// and the like do this by rule), max_statement_time — and answers 1317 (or 1969). Nothing of the
// transaction committed: the server runs a script's statements in order and stops at the first
// that fails, so its COMMIT never ran. The batch is tried again, as after a connection lost: failed
// at once, its admission was refused 503 and its settlement left to the reconciler, a hold's
// expiry later, for a statement the server would have run a moment after.
//
// Each case kills the batch's statement where it waits on a lock the test holds: the admission's
// and the settlement's user lock (the first script), the settlement's hold lock, and the
// settlement's upsert of the day ledger (the second script, after its hold was marked settled in
// the same transaction). The run ends charged once.
func TestBatchStatementKilledByTheServerIsRetried(t *testing.T) {
	cases := []killCase{
		{"admission at its user lock", true, "SELECT id FROM users WHERE id = ? FOR UPDATE", 0},
		{"settlement at its user lock", false, "SELECT id FROM users WHERE id = ? FOR UPDATE", 5_000},
		{"settlement at its hold lock", false, "SELECT run_id FROM run_holds WHERE user_id = ? AND state = 'running' FOR UPDATE", 5_000},
		{"settlement at the day ledger", false, "SELECT user_id FROM usage_days WHERE user_id = ? FOR UPDATE", 5_000},
	}
	// KILL CONNECTION ends the connection too, which the driver reports as lost: the case
	// every lost reply already took, here at each statement.
	for _, kill := range []string{"KILL QUERY", "KILL CONNECTION"} {
		for _, c := range cases {
			t.Run(kill+"/"+c.name, func(t *testing.T) { c.run(t, kill) })
		}
	}
}

// killCase is one case of TestBatchStatementKilledByTheServerIsRetried.
type killCase struct {
	name   string
	admit  bool   // the batch admits the run; else it settles it
	lock   string // what the test holds, with the user's id
	charge int64
}

// run kills (kill: KILL QUERY or KILL CONNECTION) the batch's statement waiting on c.lock.
func (c killCase) run(t *testing.T, kill string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := testenv.MySQL(t)
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	u, err := st.CreateUser(ctx, "killed-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	// A settled call, so that the user's day ledger row exists to be locked.
	first := "r_first_" + testenv.RandomID(4)
	mustAdmit(ctx, t, st, u.ID, first)
	if _, err := st.Settle(ctx, holds.Settlement{RunID: first, CostMicro: 1_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	run := "r_killed_" + testenv.RandomID(4)
	if !c.admit {
		mustAdmit(ctx, t, st, u.ID, run)
	}
	blocker := testenv.ConsoleTx(t, db)
	if _, err := blocker.ExecContext(ctx, c.lock, u.ID); err != nil {
		t.Fatal(err)
	}
	obs, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	done := make(chan error, 1)
	go func() {
		var err error
		if c.admit {
			_, err = st.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		} else {
			_, err = st.Settle(ctx, holds.Settlement{RunID: run, CostMicro: c.charge, Source: holds.SourceComplete})
		}
		done <- err
	}()
	if _, err := obs.ExecContext(ctx, fmt.Sprintf("%s %d", kill, lockWaiter(ctx, t, obs))); err != nil {
		t.Fatal(err)
	}
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("batch whose statement the server killed before its COMMIT: %v; want it tried again", err)
	}
	r, err := st.Run(ctx, u.ID, run)
	switch {
	case err != nil:
		t.Fatal(err)
	case c.admit && r.State != holds.StateRunning:
		t.Fatalf("run %+v: want the admission's hold", r)
	case !c.admit && (r.State != holds.StateSettled || r.ChargedMicro != c.charge):
		t.Fatalf("run %+v: want it settled, charged %d", r, c.charge)
	}
	if c.admit {
		if _, err := st.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceRelease}); err != nil {
			t.Fatal(err)
		}
	}
}

func mustAdmit(ctx context.Context, t *testing.T, st *holds.Store, userID uint64, run string) {
	t.Helper()
	if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: userID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
		t.Fatalf("admit %s: %v", run, err)
	}
}

// lockWaiter is the server thread of the one transaction on the test's database waiting for a
// row lock (see waitLockWaits for the pace of its polls).
func lockWaiter(ctx context.Context, t *testing.T, obs *sqlx.Conn) int64 {
	t.Helper()
	for {
		var ids []int64
		if err := obs.SelectContext(ctx, &ids, `SELECT t.trx_mysql_thread_id FROM information_schema.innodb_trx t
			JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
			WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()`); err != nil {
			t.Fatalf("looking for the lock's waiter: %v", err)
		}
		if len(ids) == 1 {
			return ids[0]
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d transactions waiting for a lock: %v", len(ids), ctx.Err())
		case <-time.After(200 * time.Millisecond): // InnoDB refreshes innodb_trx only when unread for 0.1 s
		}
	}
}

// TestConnectionRefusedAtTheServersLimitIsWaitedFor: the server refuses a batch's new
// connection because the gateway's database account has all it may open (1226, the account's
// MAX_USER_CONNECTIONS; 1203 for max_user_connections and 1040 for max_connections alike):
// the admission waits for one to free within its deadline, as for a server out of reach,
// rather than being refused 503 at once. Past its deadline it is refused, nothing held.
func TestConnectionRefusedAtTheServersLimitIsWaitedFor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := testenv.MySQL(t)
	// Its account, bound by read_only, writes: another package's test may turn read_only on.
	testenv.NoReadOnlySpell(t, root)
	cfg := restrictedAccount(ctx, t, root, testenv.MySQLDSN(t), "tg_conns_", "MAX_USER_CONNECTIONS 2")
	db, err := holds.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	core, logs := observer.New(zapcore.DebugLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	u, err := st.CreateUser(ctx, "conns-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, root) })
	// Both of the user's connections taken, by the gateway's own pool or another process.
	var held []*sqlx.Conn
	for range 2 {
		c, err := db.Connx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	admit := func(run string, actx context.Context) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := st.Admit(actx, holds.AdmitRequest{RunID: run, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
			done <- err
		}()
		return done
	}

	// Past its deadline: refused, nothing held.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if err := <-admit("r_conns_late", short); err == nil || !holds.IsUnavailable(err) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("admission without a connection past its deadline: %v; want it refused as the database unavailable", err)
	}
	if n, _ := holdRows(t, holds.NewStore(root, settlePlans, "standard", zap.NewNop()), "r_conns_late"); n != 0 {
		t.Fatalf("%d holds left by an admission that never had a connection", n)
	}

	// Within it: served once a connection is free.
	before := logs.FilterMessage("database unavailable, retrying").Len()
	done := admit("r_conns", ctx)
	for logs.FilterMessage("database unavailable, retrying").Len() == before {
		select {
		case err := <-done:
			t.Fatalf("admission refused a connection at the server's limit ended before any retry: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	held[0].Close()
	if err := <-done; err != nil {
		t.Fatalf("admission once a connection was free: %v", err)
	}
	held[1].Close()
	if _, err := st.Settle(ctx, holds.Settlement{RunID: "r_conns", Source: holds.SourceRelease}); err != nil {
		t.Fatal(err)
	}
}

// TestBatchStatementPastMaxStatementTimeIsRetried: a server whose max_statement_time is
// shorter than a batch's lock wait ends the statement with 1969, over and over while the lock
// is held; the batch is tried again within its deadline, as for a kill, and settles once the
// lock is free — not failed at once and left to the reconciler.
func TestBatchStatementPastMaxStatementTimeIsRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"max_statement_time": "0.2"}
	db := testenv.Open(t, cfg.FormatDSN())
	core, logs := observer.New(zapcore.DebugLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	u, err := st.CreateUser(ctx, "stmt-time-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	run := "r_stmt_time_" + testenv.RandomID(4)
	mustAdmit(ctx, t, st, u.ID, run)
	blocker := testenv.ConsoleTx(t, db)
	if _, err := blocker.ExecContext(ctx, "SELECT id FROM users WHERE id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := st.Settle(ctx, holds.Settlement{RunID: run, CostMicro: 4_000, Source: holds.SourceComplete})
		done <- err
	}()
	for logs.FilterMessage("database unavailable, retrying").Len() == 0 {
		select {
		case err := <-done:
			t.Fatalf("settlement whose statement ran past max_statement_time ended before any retry: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("settlement once the lock was free: %v", err)
	}
	if r, err := st.Run(ctx, u.ID, run); err != nil || r.State != holds.StateSettled || r.ChargedMicro != 4_000 {
		t.Fatalf("run %+v, %v: want it settled, charged 4000", r, err)
	}
}

// TestCommitAnsweredKilledIsClaimedByTheRetry: the server runs a batch's closing script, its
// COMMIT included, and answers the COMMIT with ER_QUERY_INTERRUPTED — what MySQL 8 answers a
// KILL QUERY that lands as the COMMIT ends. The batch must count the script as unanswered, as
// a lost reply: its retry claims the admission's committed hold, and finds the settlement its
// own. Taken at its word, the admission was refused 503 while its hold stayed, with no call
// and no tally, for the reconciler to charge in full at its expiry.
func TestCommitAnsweredKilledIsClaimedByTheRetry(t *testing.T) {
	t.Run("admission", func(t *testing.T) {
		f, lossy := newLossyFixture(t)
		ctx := context.Background()
		run := admitThroughUnansweredCommit(t, f, lossy, testenv.KilledReply, true)
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceRelease}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("settlement", func(t *testing.T) {
		f, lossy := newLossyFixture(t)
		ctx := context.Background()
		run := "r_killed_commit_" + testenv.RandomID(4)
		f.admit(run)
		lossy.Arm(commitScript, testenv.KilledReply)
		s, err := f.store.Settle(ctx, holds.Settlement{RunID: run, CostMicro: 6_000, Source: holds.SourceComplete})
		if !lossy.Fired() {
			t.Fatal("the commit was never answered killed")
		}
		if err != nil || s.ChargedMicro != 6_000 {
			t.Fatalf("settlement whose committed COMMIT was answered killed: %+v, %v; want it settled, charged 6000", s, err)
		}
		r, err := f.store.Run(ctx, f.user.ID, run)
		if err != nil || r.State != holds.StateSettled || r.ChargedMicro != 6_000 {
			t.Fatalf("run %+v, %v: want it settled once, charged 6000", r, err)
		}
	})
}
