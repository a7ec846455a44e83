package holds_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// sessionSettings are the session variables Open sets, as the server reports them.
type sessionSettings struct {
	LockWait   int64  `db:"lock_wait"`
	Wait       int64  `db:"wait"`
	IdleTx     int64  `db:"idle_tx"`
	Isolation  string `db:"isolation"`
	TimeZone   string `db:"tz"`
	AutoCommit int64  `db:"autocommit"`
}

func readSessionSettings(t *testing.T, dsn string) sessionSettings {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var s sessionSettings
	if err := db.GetContext(ctx, &s, `SELECT @@SESSION.innodb_lock_wait_timeout AS lock_wait, @@SESSION.wait_timeout AS wait,
		@@SESSION.idle_transaction_timeout AS idle_tx, @@SESSION.tx_isolation AS isolation,
		@@SESSION.time_zone AS tz, @@SESSION.autocommit AS autocommit`); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestOpenSessionSettings: the bounds the money code is written against are the session's:
// a row lock waited 3 s (lockWaitSeconds: a longer wait keeps a caller's statement, and the
// locks its transaction holds, past its deadline), a silent client dropped after
// SessionWaitTimeout and one silent inside a transaction after SessionIdleTransactionTimeout,
// READ COMMITTED, UTC. A DSN may choose its own bounds, under any case of the names, and they
// are kept; it cannot choose the isolation or the time zone.
func TestOpenSessionSettings(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	want := sessionSettings{LockWait: 3, Wait: int64(holds.SessionWaitTimeout / time.Second),
		IdleTx: int64(holds.SessionIdleTransactionTimeout / time.Second), Isolation: "READ-COMMITTED", TimeZone: "+00:00", AutoCommit: 1}
	if got := readSessionSettings(t, dsn); got != want {
		t.Errorf("session of a plain DSN: %+v, want %+v", got, want)
	}

	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{
		"INNODB_LOCK_WAIT_TIMEOUT": "7",
		"Wait_Timeout":             "600",
		"idle_transaction_timeout": "9",
		"Tx_Isolation":             "'REPEATABLE-READ'",
		"Time_Zone":                "'-05:00'",
	}
	want = sessionSettings{LockWait: 7, Wait: 600, IdleTx: 9, Isolation: "READ-COMMITTED", TimeZone: "+00:00", AutoCommit: 1}
	// Several times: a name sent twice, in two cases, is set in the driver's map order, which
	// changes from one connection to the next.
	for range 8 {
		if got := readSessionSettings(t, cfg.FormatDSN()); got != want {
			t.Fatalf("session of a DSN setting its own bounds, isolation and time zone: %+v, want %+v (its bounds kept, its isolation and zone not)", got, want)
		}
	}
}

// TestOpenPoolIsBoundedAndKeepsItsConnections: a burst of money transactions uses at most
// maxOpenConns (64) connections, the 65th caller waiting for one rather than opening another
// (more only queue inside MySQL on the same row locks); and the pool keeps them all when the
// burst ends, rather than closing all but two and reconnecting on the next burst.
func TestOpenPoolIsBoundedAndKeepsItsConnections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := holds.Open(ctx, testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const bound = 64
	var txs []*sql.Tx
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback()
		}
	}()
	for i := 0; i < bound; i++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatalf("transaction %d of %d: %v", i+1, bound, err)
		}
		if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	tx, err := db.BeginTx(wctx, nil)
	wcancel()
	if err == nil {
		_ = tx.Rollback()
		t.Fatalf("transaction %d began while %d held the pool's connections (%d open): the pool is not bounded at %d",
			bound+1, bound, db.Stats().OpenConnections, bound)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("transaction %d: %v, want it to wait for a connection until its deadline", bound+1, err)
	}
	for _, tx := range txs {
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	txs = nil
	if st := db.Stats(); st.Idle != bound || st.MaxIdleClosed != 0 {
		t.Fatalf("after the burst: %d idle, %d closed for the idle limit; want all %d kept", st.Idle, st.MaxIdleClosed, bound)
	}
}

// TestIdleTransactionBoundIsTheSessions: serve warns when a paused gateway would hold its users'
// rows for the whole pause, reading the bound from IdleTransactionBound: Open's own (2 s), a
// DSN's own, and none for a DSN's 0.
func TestIdleTransactionBoundIsTheSessions(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		param string
		want  time.Duration
	}{
		{"", holds.SessionIdleTransactionTimeout},
		{"9", 9 * time.Second},
		{"0", 0},
	} {
		cfg.Params = nil
		if c.param != "" {
			cfg.Params = map[string]string{"idle_transaction_timeout": c.param}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		db, err := holds.Open(ctx, cfg.FormatDSN())
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		got, err := holds.IdleTransactionBound(ctx, db)
		db.Close()
		cancel()
		if err != nil || got != c.want {
			t.Errorf("idle transaction bound with the DSN's idle_transaction_timeout %q: %v, %v; want %v", c.param, got, err, c.want)
		}
	}
}

// TestOpenKeepsTheDSNsReadTimeout: a DSN's readTimeout is the operator's bound on one reply,
// for the money paths and for a migration alike (Open's own default, or none for a migration,
// apply only when the DSN sets none): a statement outlasting it fails rather than waiting.
func TestOpenKeepsTheDSNsReadTimeout(t *testing.T) {
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ReadTimeout = time.Second
	for name, open := range map[string]func(context.Context, string) (*sqlx.DB, error){
		"Open": holds.Open, "OpenForMigrate": holds.OpenForMigrate, "OpenForReports": holds.OpenForReports,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		db, err := open(ctx, cfg.FormatDSN())
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		var slept int
		err = db.GetContext(ctx, &slept, "SELECT SLEEP(3)")
		db.Close()
		cancel()
		if err == nil {
			t.Errorf("%s with the DSN's readTimeout=1s: a 3 s statement was answered, want it cut at the DSN's read timeout", name)
		}
	}
}

// TestReadOnlyBypassIsTheAccountsOwn: serve's read_only warning names the privileges of its
// own account only. One that may read every account's grants (SELECT on *.*, a monitoring
// account's) but holds no SUPER is bound by read_only, and must not be warned of another
// account's SUPER.
func TestReadOnlyBypassIsTheAccountsOwn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn := testenv.MySQLDSN(t)
	root := testenv.Open(t, dsn)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if privs, err := holds.ReadOnlyBypass(ctx, root); err != nil || len(privs) == 0 {
		t.Fatalf("the tests' account (ALL PRIVILEGES): %v, %v; want SUPER among its privileges", privs, err)
	}
	c := *cfg
	c.User, c.Passwd = "tg_rosel_"+testenv.RandomID(4), testenv.RandomID(8)
	if _, err := root.ExecContext(ctx, "CREATE USER '"+c.User+"'@'%' IDENTIFIED BY '"+c.Passwd+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = root.Exec("DROP USER IF EXISTS '" + c.User + "'@'%'") })
	if _, err := root.ExecContext(ctx, "GRANT SELECT ON *.* TO '"+c.User+"'@'%'"); err != nil {
		t.Fatal(err)
	}
	reader := testenv.Open(t, c.FormatDSN())
	if privs, err := holds.ReadOnlyBypass(ctx, reader); err != nil || len(privs) != 0 {
		t.Fatalf("an account with SELECT on *.* and no SUPER: %v, %v; want none (others' privileges are not its own)", privs, err)
	}
}
