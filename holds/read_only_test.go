package holds_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// gatewayAccount creates an account on dsn's database with what a production gateway's has —
// SELECT, INSERT, UPDATE, DELETE on its database, neither SUPER nor READ_ONLY ADMIN — and
// opens it: read_only binds it, as it does not bind the tests' own account (all privileges).
// root is a handle of the tests' account; the account is dropped at cleanup.
func gatewayAccount(ctx context.Context, t *testing.T, root *sqlx.DB, dsn string) *sqlx.DB {
	t.Helper()
	return testenv.Open(t, restrictedAccount(ctx, t, root, dsn, "tg_gw_", "").FormatDSN())
}

// restrictedAccount creates an account with SELECT, INSERT, UPDATE and DELETE on the tests'
// database alone, made WITH the given limits (may be ""), and returns dsn for it; the account
// is dropped at cleanup.
func restrictedAccount(ctx context.Context, t *testing.T, root *sqlx.DB, dsn, prefix, with string) *mysql.Config {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name, password := prefix+testenv.RandomID(4), testenv.RandomID(8)
	create := "CREATE USER '" + name + "'@'%' IDENTIFIED BY '" + password + "'"
	if with != "" {
		create += " WITH " + with
	}
	if _, err := root.ExecContext(ctx, create); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = root.Exec("DROP USER IF EXISTS '" + name + "'@'%'") })
	if _, err := root.ExecContext(ctx, "GRANT SELECT, INSERT, UPDATE, DELETE ON `"+cfg.DBName+"`.* TO '"+name+"'@'%'"); err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = name, password
	return cfg
}

// readOnlyFixture is a store on a gateway account (gatewayAccount) of a fresh database, with
// a handle of the tests' account on the same database and what sets the server read_only.
type readOnlyFixture struct {
	root     *sqlx.DB
	store    *holds.Store
	logs     *observer.ObservedLogs
	readOnly func(on bool)
}

func newReadOnlyFixture(ctx context.Context, t *testing.T) *readOnlyFixture {
	dsn := testenv.MySQLDSN(t)
	root := testenv.Open(t, dsn)
	t.Cleanup(func() { testenv.CheckLedger(t, root) })
	// Registered after the audit: cleanups run last first, so the server takes writes again
	// before anything else of the test's ends.
	f := &readOnlyFixture{root: root, readOnly: testenv.ServerReadOnly(t, root)}
	core, logs := observer.New(zapcore.WarnLevel)
	f.logs = logs
	f.store = holds.NewStore(gatewayAccount(ctx, t, root, dsn), settlePlans, "standard", zap.New(core))
	f.store.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	return f
}

// retries is how many times the store has tried a batch again for the database.
func (f *readOnlyFixture) retries() int {
	return f.logs.FilterMessage("database unavailable, retrying").Len()
}

// TestWriterRidesOutAShortReadOnlySpell: callers admit and settle calls through the batch
// writer while the server turns read_only for a moment (a failover demoting the primary, a
// maintenance switch), as a gateway's account sees it (no SUPER, no READ_ONLY ADMIN): every
// batch's locking read, write or COMMIT is refused (1290). The refusal is the server's, not the
// batch's: nothing committed, and the batch is tried again within its deadline, as for a lost
// connection. Failed at once, every admission of the spell was refused 503 and every settlement
// left to the reconciler, a hold's expiry later, for a server that took writes again a moment
// after. Every call is admitted, settled and charged once: the day ledger is the sum of what
// the callers were told they were charged, every run's row says the same, and no hold is left.
func TestWriterRidesOutAShortReadOnlySpell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newReadOnlyFixture(ctx, t)
	suffix := testenv.RandomID(4)
	const users, callers = 3, 3 // callers per user: the plan's in-flight limit
	ids := standardUsers(ctx, t, f.store, users, "ro-", suffix)
	// Deadlines far past the spell: it ends on the test's word, once batches are seen waiting.
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 2, MaxBatch: 32, Linger: time.Millisecond,
		AdmitTimeout: 30 * time.Second, SettleTimeout: 30 * time.Second})
	defer w.Close()

	var (
		mu       sync.Mutex
		told     = map[string]int64{} // run -> what its settlement said it charged
		firstErr error
		failed   atomic.Bool
		settled  atomic.Int64
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		failed.Store(true)
	}
	for ui, uid := range ids {
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(ui), uint64(c)))
				for j := 0; ctx.Err() == nil; j++ {
					select {
					case <-stop:
						return
					default:
					}
					run := "r_ro_" + suffix + "_" + strconv.Itoa(ui) + "_" + strconv.Itoa(c) + "_" + strconv.Itoa(j)
					if _, err := w.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: uid, Model: "fake-gpt",
						State: holds.StateRunning, TTL: time.Minute, Fresh: true, Token: testenv.RandomID(16)}); err != nil {
						fail(err)
						return
					}
					cost := rng.Int64N(3_000)
					res, err := w.Settle(ctx, holds.Settlement{RunID: run, UserID: uid, CostMicro: cost, Calls: 1, Source: holds.SourceComplete})
					if err == nil && (!res.Applied || res.ChargedMicro != cost) {
						err = errors.New("settle " + run + ": not applied at its cost")
					}
					if err != nil {
						fail(err)
						return
					}
					mu.Lock()
					told[run] = res.ChargedMicro
					mu.Unlock()
					settled.Add(1)
				}
			}()
		}
	}
	finish := func() {
		close(stop)
		wg.Wait()
	}
	// waitFor waits until cond holds, or a caller has failed, or the test's time is out.
	waitFor := func(what string, cond func() bool) {
		for !cond() && !failed.Load() {
			select {
			case <-ctx.Done():
				f.readOnly(false)
				finish()
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	waitFor("calls before the spell", func() bool { return settled.Load() >= 30 })
	f.readOnly(true)
	// The spell lasts until batches have been seen refused and waiting: a few retries.
	waitFor("batches refused read_only", func() bool { return f.retries() >= 5 })
	f.readOnly(false)
	during := settled.Load()
	waitFor("calls after the spell", func() bool { return settled.Load() >= during+30 })
	finish()
	if firstErr != nil {
		t.Fatalf("call during a read_only spell shorter than its batch's deadline: %v; want it served once the server took writes", firstErr)
	}

	var ledger, rows, charged, live int64
	if err := f.root.GetContext(ctx, &ledger, "SELECT COALESCE(SUM(used_micro), 0) FROM usage_days"); err != nil {
		t.Fatal(err)
	}
	if err := f.root.QueryRowxContext(ctx, `SELECT COUNT(*), COALESCE(SUM(charged_micro), 0), COALESCE(SUM(state IN ('queued', 'running')), 0)
		FROM run_holds`).Scan(&rows, &charged, &live); err != nil {
		t.Fatal(err)
	}
	var sum int64
	for run, c := range told {
		sum += c
		var row int64
		if err := f.root.GetContext(ctx, &row, "SELECT charged_micro FROM run_holds WHERE run_id = ? AND state = 'settled'", run); err != nil || row != c {
			t.Errorf("run %s: row charged %d (%v); its settlement said %d", run, row, err, c)
		}
	}
	if live != 0 || rows != int64(len(told)) || charged != sum || ledger != sum {
		t.Fatalf("%d calls told charged %d in all; %d holds (%d left live) charged %d, day ledger %d: want every call charged once, no hold left",
			len(told), sum, rows, live, charged, ledger)
	}
}

// TestWriterReadOnlyPastItsDeadline: a server that stays read_only past a batch's deadline
// (maintenance, a failover that does not finish) refuses its admission as the database
// unavailable (the proxy's 503 billing_unavailable with Retry-After), at the deadline and with
// nothing held, and its settlement with nothing charged — not ErrOutcomeUnknown: the server
// refused every write and COMMIT, so nothing was sent unanswered — its hold left live for the
// reconciler.
func TestWriterReadOnlyPastItsDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newReadOnlyFixture(ctx, t)
	u, err := f.store.CreateUser(ctx, "ro-long-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	settling := "r_ro_long_settle_" + testenv.RandomID(4)
	if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: settling, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
		t.Fatal(err)
	}
	// The admission must start its batch before its deadline (a tenth of it left) to be refused
	// by the server: at 300 ms a worker descheduled for 270 ms on a loaded machine answered it
	// not started, which the test does not take for the refusal it is about.
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: 2 * time.Second, SettleTimeout: 3 * time.Second})
	defer w.Close()
	f.readOnly(true)
	admitting := "r_ro_long_admit_" + testenv.RandomID(4)
	_, aerr := w.Admit(ctx, holds.AdmitRequest{RunID: admitting, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute,
		Fresh: true, Token: testenv.RandomID(16)})
	_, serr := w.Settle(ctx, holds.Settlement{RunID: settling, UserID: u.ID, CostMicro: 4_000, Source: holds.SourceComplete})
	tried := f.retries()
	f.readOnly(false)
	// Its last try may end at the deadline rather than at a refusal.
	unavailable := func(err error) bool { return holds.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded) }
	if aerr == nil || !unavailable(aerr) || errors.Is(aerr, holds.ErrOutcomeUnknown) {
		t.Errorf("admission while the server stayed read_only: %v; want it refused as the database unavailable, not unknown", aerr)
	}
	if serr == nil || !unavailable(serr) || errors.Is(serr, holds.ErrOutcomeUnknown) {
		t.Errorf("settlement while the server stayed read_only: %v; want it failed as the database unavailable, not unknown", serr)
	}
	if tried == 0 {
		t.Errorf("no batch was tried again while the server was read_only")
	}
	if n, _ := holdRows(t, f.store, admitting); n != 0 {
		t.Errorf("the refused admission left %d holds", n)
	}
	if n, state := holdRows(t, f.store, settling); n != 1 || state != string(holds.StateRunning) {
		t.Errorf("the failed settlement's run: %d rows, state %q; want its hold live, nothing charged", n, state)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: settling, CostMicro: 4_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestCommitRefusedReadOnlyAfterTheWritesIsRetried: the server turns read_only while a batch's
// closing script runs, after its writes and before its COMMIT — here the settlement's upsert of
// the day ledger waits on a lock the test holds, SET GLOBAL read_only waits for that statement,
// and the lock's release lets both through — and refuses the COMMIT (1290). The server checks
// read_only after it has blocked a read lock's taking and before it commits, and rolls the
// transaction back: nothing committed, the outcome is known, and the batch is tried again as a
// fresh transaction, which settles the run once the server takes writes. Not counted as an
// unanswered COMMIT: a retry that failed too would have told its caller ErrOutcomeUnknown for
// a settlement that certainly did not happen.
//
// Which of the COMMIT and the setter goes first once the upsert ends is the server's choice
// (the setter, mostly, on an idle box; under load the COMMIT won ten tries in a row twice in
// stop 78's mutation runs): each try ends charged once either way, and tries are made until
// one COMMIT was refused, at most 40 (a try takes a fraction of a second).
func TestCommitRefusedReadOnlyAfterTheWritesIsRetried(t *testing.T) {
	t.Run("retried", func(t *testing.T) { commitRefusedTries(t, false) })
	// The batch gives up while the server stays read_only: it is told a plain failure, its
	// run still live, not ErrOutcomeUnknown, as if its COMMIT might have committed.
	t.Run("given up", func(t *testing.T) { commitRefusedTries(t, true) })
}

// commitRefusedTries is TestCommitRefusedReadOnlyAfterTheWritesIsRetried: tries until a
// COMMIT was refused (commitRefusedReadOnly), at most maxTries.
func commitRefusedTries(t *testing.T, giveUp bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newReadOnlyFixture(ctx, t)
	u, err := f.store.CreateUser(ctx, "ro-commit-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	// A settled call, so that the user's day ledger row exists to be locked.
	first := "r_ro_first_" + testenv.RandomID(4)
	mustAdmit(ctx, t, f.store, u.ID, first)
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: first, CostMicro: 1_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	const maxTries = 40
	used := int64(1_000)
	for try := range maxTries {
		run := "r_ro_commit_" + strconv.Itoa(try) + "_" + testenv.RandomID(4)
		refused := commitRefusedReadOnly(ctx, t, f, u.ID, run, giveUp)
		used += 5_000
		if r, err := f.store.Run(ctx, u.ID, run); err != nil || r.State != holds.StateSettled || r.ChargedMicro != 5_000 {
			t.Fatalf("run %+v, %v: want it settled, charged 5000", r, err)
		}
		if bal, err := testenv.BalanceAllDays(ctx, f.store, u.ID); err != nil || bal.UsedTodayMicro != used {
			t.Fatalf("balance %+v, %v: want %d, every charge once", bal, err, used)
		}
		if refused {
			t.Logf("a COMMIT refused on try %d", try+1)
			return
		}
	}
	t.Fatalf("no COMMIT of %d was refused: the server set read_only after each", maxTries)
}

// commitRefusedReadOnly settles run (admitted here) at 5000 while the server turns read_only
// between its writes and its COMMIT (see TestCommitRefusedReadOnlyAfterTheWritesIsRetried),
// and reports whether the COMMIT was refused: the batch was then tried again. giveUp ends the
// refused batch's retries while the server is read_only, and settles the run afresh after.
func commitRefusedReadOnly(ctx context.Context, t *testing.T, f *readOnlyFixture, userID uint64, run string, giveUp bool) bool {
	t.Helper()
	mustAdmit(ctx, t, f.store, userID, run)
	blocker := testenv.ConsoleTx(t, f.root)
	if _, err := blocker.ExecContext(ctx, "SELECT user_id FROM usage_days WHERE user_id = ? FOR UPDATE", userID); err != nil {
		t.Fatal(err)
	}
	obs, err := f.root.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	before := f.retries()
	sctx, stopSettling := context.WithCancel(ctx)
	defer stopSettling()
	done := make(chan error, 1)
	go func() {
		_, err := f.store.Settle(sctx, holds.Settlement{RunID: run, CostMicro: 5_000, Source: holds.SourceComplete})
		done <- err
	}()
	freshLockWaiter(ctx, t, obs) // the upsert waits, its hold's row already marked settled
	setter, err := f.root.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer setter.Close()
	var setterID int64
	if err := setter.GetContext(ctx, &setterID, "SELECT CONNECTION_ID()"); err != nil {
		t.Fatal(err)
	}
	set := make(chan error, 1)
	go func() {
		_, err := setter.ExecContext(ctx, "SET GLOBAL read_only = 1")
		set <- err
	}()
	// The setter waits for the running upsert to end before it turns read_only on.
	for {
		var state string
		if err := obs.GetContext(ctx, &state, "SELECT COALESCE(state, '') FROM information_schema.processlist WHERE id = ?", setterID); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(state, "Waiting for") {
			break
		}
		select {
		case err := <-set:
			t.Fatalf("SET GLOBAL read_only did not wait for the running write: %v", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-set; err != nil {
		t.Fatalf("SET GLOBAL read_only: %v", err)
	}
	// Refused, the batch waits for the server to take writes again; else it has settled.
	for f.retries() == before {
		select {
		case err := <-done:
			f.readOnly(false)
			if err != nil {
				t.Fatalf("settlement whose COMMIT the server refused read_only: %v; want it tried again and settled", err)
			}
			return false
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if giveUp {
		stopSettling()
		err := <-done
		f.readOnly(false)
		if err == nil || errors.Is(err, holds.ErrOutcomeUnknown) {
			t.Fatalf("settlement whose COMMIT the server refused read_only, given up: %v; want a plain failure, nothing charged", err)
		}
		if n, state := holdRows(t, f.store, run); n != 1 || state != string(holds.StateRunning) {
			t.Fatalf("run of the given-up settlement: %d rows, state %q; want its hold live", n, state)
		}
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, CostMicro: 5_000, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
		return true
	}
	f.readOnly(false)
	if err := <-done; err != nil {
		t.Fatalf("settlement whose COMMIT the server refused read_only: %v; want it tried again and settled", err)
	}
	return true
}

// freshLockWaiter is lockWaiter whose every look is fresh: InnoDB serves information_schema.
// innodb_trx from a cache it refreshes only when unread for 0.1 s, and a look right after a
// try's would find that try's waiter, long gone.
func freshLockWaiter(ctx context.Context, t *testing.T, obs *sqlx.Conn) int64 {
	t.Helper()
	select {
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	case <-time.After(200 * time.Millisecond):
	}
	return lockWaiter(ctx, t, obs)
}

// TestReadOnlyConnectionsLeaveThePool: after a failover the pool's connections still lead to
// the demoted primary, which refuses every write, while a new connection, dialled through the
// switched address (DNS, a proxy), reaches the new one. Staged on one server: the pool's idle
// connections are made read-only sessions (SET SESSION TRANSACTION READ ONLY: 1792 on a locking
// read or a write), and a new one takes writes. A batch refused so must not put its connection
// back, nor go on drawing the others — the pool hands back the connection returned last, so
// its retries met the same refusal until its deadline, and until the connections' lifetime ran
// out (5 minutes) every batch did — and the write check (readyz) alike, or a gateway taken out
// of rotation for it would stay out for as long. Once one refusal is seen, every idle
// connection is closed: the next batch, and the next check, dial anew.
func TestReadOnlyConnectionsLeaveThePool(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testenv.MySQL(t)
	st, logs, u := demotableStore(ctx, t, db, "ro-pool-")

	t.Run("batch", func(t *testing.T) { batchOnADemotedPool(ctx, t, db, st, logs, u) })
	t.Run("write check", func(t *testing.T) {
		demote(ctx, t, db, 8)
		if err := st.CheckWritable(ctx); err == nil {
			t.Fatal("write check on a read-only connection passed")
		}
		if err := st.CheckWritable(ctx); err != nil {
			t.Fatalf("write check after one refused: %v; want it made on a new connection", err)
		}
		checkPoolWritable(ctx, t, db)
	})
	// The instance's heartbeat, alone on a gateway that serves no call and whose readyz nobody
	// polls: its refused connection went back to the pool and the next beat drew it again, so
	// it beat against the demoted server until the connection's lifetime ran out (5 minutes),
	// long enough for a process on the promoted one to declare it dead (holds.dead_instance_
	// after) and log that someone should look.
	t.Run("heartbeat", func(t *testing.T) {
		self, err := st.RegisterInstance(ctx, "ro-beat", time.Second, 0, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = self.Retire(ctx) }()
		demote(ctx, t, db, 8)
		if err := self.Beat(ctx); err == nil {
			t.Fatal("beat on a read-only connection passed")
		}
		if err := self.Beat(ctx); err != nil {
			t.Fatalf("beat after one refused: %v; want it made on a new connection", err)
		}
		checkPoolWritable(ctx, t, db)
	})
	// A transaction retried by the store's own loop (withRetry: a session claim) whose locking
	// read the server refused: its connection went back to the pool at the rollback, and each
	// try drew it again until the caller's deadline.
	t.Run("transaction", func(t *testing.T) {
		run := "r_ro_pool_sess_" + testenv.RandomID(8)
		if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, Model: "fake-gpt",
			State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		demote(ctx, t, db, 8)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := st.ClaimSession(cctx, u.ID, "ro-pool-sess-"+testenv.RandomID(4), run, [32]byte{1}); err != nil {
			t.Fatalf("session claim on a pool of read-only connections: %v; want it tried again on a new connection", err)
		}
		if _, err := st.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
		checkPoolWritable(ctx, t, db)
	})
	// A registration (the gateway's start, tried again by its supervisor; a process declared
	// dead registering anew at its next beat) refused likewise.
	t.Run("registration", func(t *testing.T) {
		demote(ctx, t, db, 8)
		if _, err := st.RegisterInstance(ctx, "ro-register", time.Second, 0, zap.NewNop()); err == nil {
			t.Fatal("registration on a read-only connection passed")
		}
		self, err := st.RegisterInstance(ctx, "ro-register", time.Second, 0, zap.NewNop())
		if err != nil {
			t.Fatalf("registration after one refused: %v; want it made on a new connection", err)
		}
		if err := self.Retire(ctx); err != nil {
			t.Fatal(err)
		}
		checkPoolWritable(ctx, t, db)
	})
}

// demotableStore is a store on db whose read-only refusals are logged in logs, its retries
// quick, and a user of it (named prefix and a random suffix); the ledger is checked at the end.
func demotableStore(ctx context.Context, t *testing.T, db *sqlx.DB, prefix string) (*holds.Store, *observer.ObservedLogs, holds.User) {
	t.Helper()
	core, logs := observer.New(zapcore.WarnLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	u, err := st.CreateUser(ctx, prefix+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	return st, logs, u
}

// batchOnADemotedPool admits and settles a run with 8 of db's connections demoted (demote): the
// admission's first try meets a read-only connection, its second a new one, since the first
// refusal closed every idle one.
func batchOnADemotedPool(ctx context.Context, t *testing.T, db *sqlx.DB, st *holds.Store, logs *observer.ObservedLogs, u holds.User) {
	t.Helper()
	demote(ctx, t, db, 8)
	before := logs.FilterMessage("database unavailable, retrying").Len()
	run := "r_ro_pool_" + testenv.RandomID(4)
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
}

// demote makes n of db's connections read-only sessions and puts them back in its pool, idle:
// connections to a server that no longer takes writes.
func demote(ctx context.Context, t *testing.T, db *sqlx.DB, n int) {
	t.Helper()
	conns := make([]*sqlx.Conn, n)
	for i := range conns {
		c, err := db.Connx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ExecContext(ctx, "SET SESSION TRANSACTION READ ONLY"); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Close()
	}
}

// checkPoolWritable takes every idle connection of db's pool at once and fails the test for
// each that refuses a write.
func checkPoolWritable(ctx context.Context, t *testing.T, db *sqlx.DB) {
	t.Helper()
	idle := db.Stats().Idle
	var conns []*sqlx.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range idle {
		c, err := db.Connx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.ExecContext(ctx, "UPDATE users SET id = id WHERE 1 = 0"); err != nil {
			t.Errorf("a connection left in the pool refuses writes: %v", err)
		}
	}
}

// TestRunCallRecordRidesOutAReadOnlySpell: a named run's call record (RecordRunCall) refused
// by a read_only server is tried again until the server takes writes, within its caller's
// deadline. Failed at once, the run's row missed the call for good: admission and
// /v1/credits count a live named run at what its row records (owedSQL) when that is more than
// its hold, so the user's next calls were admitted against credits the call had spent — past
// DESIGN §3's overdraft bound until the run settled — and the run's expiry was not pushed
// out. A refusal is known not to have landed (the server refuses the UPDATE before it runs),
// so the retry cannot count the call twice.
func TestRunCallRecordRidesOutAReadOnlySpell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newReadOnlyFixture(ctx, t)
	u, err := f.store.CreateUser(ctx, "ro-rec-"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	run := "x_ro_rec_" + testenv.RandomID(8)
	if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: run, ClientRunID: "agent-" + testenv.RandomID(4), UserID: u.ID,
		Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	before, err := f.store.Run(ctx, u.ID, run)
	if err != nil {
		t.Fatal(err)
	}
	f.readOnly(true)
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		ok, err := f.store.RecordRunCall(rctx, run, token.New(), time.Hour, pricing.Usage{Input: 1_000, Output: 100}, 7_000, 1, false)
		done <- result{ok, err}
	}()
	// The spell lasts until the record has been seen refused and waiting: a few retries.
	for f.retries() < 3 {
		select {
		case r := <-done:
			f.readOnly(false)
			t.Fatalf("record during a read_only spell: recorded %v, %v; want it tried again until the server takes writes", r.ok, r.err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	f.readOnly(false)
	r := <-done
	if r.err != nil || !r.ok {
		t.Fatalf("record once the server took writes: recorded %v, %v; want recorded", r.ok, r.err)
	}
	after, err := f.store.Run(ctx, u.ID, run)
	if err != nil {
		t.Fatal(err)
	}
	if after.CostMicro != 7_000 || after.Calls != 1 || after.EndedCalls != 1 || after.InTok != 1_000 || after.OutTok != 100 {
		t.Errorf("run's row after the spell: cost %d, calls %d, ended %d, tokens %d/%d; want the call recorded once (7000, 1, 1, 1000/100)",
			after.CostMicro, after.Calls, after.EndedCalls, after.InTok, after.OutTok)
	}
	if !after.ExpiresAt.After(before.ExpiresAt) {
		t.Errorf("run's expiry %v not pushed out past %v by the record", after.ExpiresAt, before.ExpiresAt)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, CostMicro: after.CostMicro, Usage: after.Usage(), Calls: 1,
		Source: holds.SourceClient}); err != nil {
		t.Fatal(err)
	}
}

// TestSessionClaimRidesOutAReadOnlySpell: a session's claim (one transaction of its own, after
// the call's admission) refused read_only is tried again within its deadline, as the
// admission before it was: refused at once, a call the spell's admission had waited for was
// answered 503 after all, its hold released.
func TestSessionClaimRidesOutAReadOnlySpell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newReadOnlyFixture(ctx, t)
	u, err := f.store.CreateUser(ctx, "ro-sess-"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	run := "r_ro_sess_" + testenv.RandomID(8)
	if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	f.readOnly(true)
	done := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := f.store.ClaimSession(cctx, u.ID, "sess-ro-"+testenv.RandomID(4), run, [32]byte{1})
		done <- err
	}()
	for f.retries() < 3 {
		select {
		case err := <-done:
			f.readOnly(false)
			t.Fatalf("session claim during a read_only spell: %v; want it tried again until the server takes writes", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	f.readOnly(false)
	if err := <-done; err != nil {
		t.Fatalf("session claim once the server took writes: %v", err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestReconcilerExtendRidesOutAReadOnlySpell: a call outlives its hold (a long stream) while
// the server is read_only for a moment; the reconciler finds the hold expired and leased, and
// pushes its expiry out. The extension refused at once failed the hold and the pass (logged at
// error level, counted as a failed pass), and left the hold expired until the next pass, a
// reconcile period later: the user's in-flight count left it out meanwhile, a slot given
// twice. It is tried again within the hold's time in the pass, as the reconciler's
// settlements are, and lands once the server takes writes.
func TestReconcilerExtendRidesOutAReadOnlySpell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newReadOnlyFixture(ctx, t)
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	u, err := f.store.CreateUser(ctx, "ro-ext-"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	run := "r_ro_ext_" + testenv.RandomID(8)
	if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// The call outlives its hold: its hold has run out, its process still leases the run.
	if _, err := f.root.ExecContext(ctx, "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = ?", run); err != nil {
		t.Fatal(err)
	}
	leases := runstate.NewLeases(rdb, keys, "serving", time.Minute, time.Second, zap.NewNop())
	leases.Acquire(run)
	if err := leases.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	rec := holds.NewReconciler(holds.ReconcilerConfig{
		Store: f.store, Usage: tallyUsage{runstate.NewTally(rdb, keys, time.Hour)}, Leases: leaseKeys{rdb, keys},
		Lock: nxLock{rdb: rdb, key: keys.ReconcileLock(), instance: "me", ttl: time.Minute},
		Log:  zap.NewNop(), ExtendBy: time.Hour, Interval: time.Second,
	})
	f.readOnly(true)
	type result struct {
		st  holds.Stats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := rec.RunOnce(ctx)
		done <- result{st, err}
	}()
	for f.retries() < 3 {
		select {
		case r := <-done:
			f.readOnly(false)
			t.Fatalf("reconcile pass during a read_only spell: %+v, %v; want the extension tried again until the server takes writes", r.st, r.err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	f.readOnly(false)
	r := <-done
	if r.err != nil || r.st.Extended != 1 || r.st.Errors != 0 {
		t.Fatalf("reconcile pass once the server took writes: %+v, %v; want the hold extended", r.st, r.err)
	}
	got, err := f.store.Run(ctx, u.ID, run)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != holds.StateRunning || got.ExpiresAt.Before(got.ReadAt.Add(50*time.Minute)) {
		t.Errorf("hold after the pass: state %s, expires %v (read at %v); want running and pushed out by the hold TTL (1h)",
			got.State, got.ExpiresAt, got.ReadAt)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestCreateUserAndKeyReplyLostAreNotSentAgain: a user's or a key's creation is tried again
// after a read_only refusal (TestAdminWriteReadOnlyRiddenOutThen503 in admin), which ran
// nothing, and never after a lost reply, whose INSERT may have landed: sent again, a user's
// answered "exists" for the user it had made, and a key's made a second key, the first live
// and shown to nobody. Each is answered as the database out of reach (the admin API's 503),
// with one row written.
func TestCreateUserAndKeyReplyLostAreNotSentAgain(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	lossy.Arm("INSERT INTO users", testenv.LoseReply)
	_, err := f.store.CreateUser(ctx, "lost-"+testenv.RandomID(3), "standard")
	if !lossy.Fired() {
		t.Fatal("the create user's reply was never lost")
	}
	if err == nil || !holds.IsUnavailable(err) {
		t.Errorf("create user whose reply was lost: %v; want the database unavailable", err)
	}
	var users int
	if err := f.store.DB().GetContext(ctx, &users, "SELECT COUNT(*) FROM users WHERE name LIKE 'lost-%'"); err != nil || users != 1 {
		t.Errorf("users made by the create whose reply was lost: %d, %v; want 1 (sent once)", users, err)
	}
	lossy.Arm("INSERT INTO api_keys", testenv.LoseReply)
	_, err = f.store.CreateKey(ctx, f.user.ID)
	if !lossy.Fired() {
		t.Fatal("the create key's reply was never lost")
	}
	if err == nil || !holds.IsUnavailable(err) {
		t.Errorf("create key whose reply was lost: %v; want the database unavailable", err)
	}
	var keys int
	if err := f.store.DB().GetContext(ctx, &keys, "SELECT COUNT(*) FROM api_keys WHERE user_id = ?", f.user.ID); err != nil || keys != 1 {
		t.Errorf("keys made by the create whose reply was lost: %d, %v; want 1 (sent once)", keys, err)
	}
}

// TestReconcilePassEndsWithinTheLockThroughAReadOnlySpell: a pass during a spell longer than
// itself spends its hold's whole item timeout retrying (the extension above), and the sessions'
// prune after the scan is refused too. The prune retried for another item timeout of its own,
// and the pass outlived the reconcile lock (50 s under the defaults, 80 s so): a second
// process took the lock and scanned beside it. The prune's batches end by the pass's own end
// (its time budget plus one item timeout), so the lock, taken for that long and a margin, is
// still this pass's when it returns.
func TestReconcilePassEndsWithinTheLockThroughAReadOnlySpell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newReadOnlyFixture(ctx, t)
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	u, err := f.store.CreateUser(ctx, "ro-pass-"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	run := "r_ro_pass_" + testenv.RandomID(8)
	if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.root.ExecContext(ctx, "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = ?", run); err != nil {
		t.Fatal(err)
	}
	// A session idle past SessionPruneIdle whose run is gone: the prune's to delete.
	if _, err := f.root.ExecContext(ctx, `INSERT INTO sessions (user_id, session_id, current_run_id, message_hash, updated_at)
		VALUES (?, ?, ?, REPEAT('x', 32), NOW(6) - INTERVAL 1 HOUR)`, u.ID, "s-"+testenv.RandomID(8), "r_gone_"+testenv.RandomID(8)); err != nil {
		t.Fatal(err)
	}
	leases := runstate.NewLeases(rdb, keys, "serving", time.Minute, time.Second, zap.NewNop())
	leases.Acquire(run)
	if err := leases.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	const budget, item = 100 * time.Millisecond, 1500 * time.Millisecond
	lock := nxLock{rdb: rdb, key: keys.ReconcileLock(), instance: "me", ttl: budget + item + time.Second}
	core, logs := observer.New(zapcore.WarnLevel)
	rec := holds.NewReconciler(holds.ReconcilerConfig{
		Store: f.store, Usage: tallyUsage{runstate.NewTally(rdb, keys, time.Hour)}, Leases: leaseKeys{rdb, keys},
		Lock: lock, Log: zap.New(core), ExtendBy: time.Hour, Interval: time.Second, PassBudget: budget,
	})
	rec.SetItemTimeout(item)
	f.readOnly(true)
	st, err := rec.RunOnce(ctx)
	owner, lerr := rdb.Get(ctx, lock.key).Result()
	f.readOnly(false)
	if !st.Locked || st.Errors != 1 || err == nil {
		t.Fatalf("pass through the spell: %+v, %v; want it to hold the lock and fail its one hold", st, err)
	}
	if lerr != nil || owner != "me" {
		t.Fatalf("reconcile lock when the pass returned: %q, %v; want still this pass's (the pass outlived its lock)", owner, lerr)
	}
	if logs.FilterMessageSnippet("sessions").Len() != 1 {
		t.Errorf("logs about the sessions' prune: %v; want one (refused, or no time left)", logs.FilterMessageSnippet("sessions").All())
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
