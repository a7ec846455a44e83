package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
)

// Pool limits. A money transaction holds a connection for a few milliseconds; more
// connections than this only queue inside MySQL on the same row locks.
const (
	maxOpenConns    = 64
	connMaxLifetime = 5 * time.Minute
	// connMaxIdleTime closes a pooled connection idle this long, well before the server's
	// SessionWaitTimeout would (the pool's cleaner runs once per this interval).
	connMaxIdleTime = time.Minute
)

// SessionWaitTimeout bounds how long the server waits for a silent client's next statement
// (the session's wait_timeout; a DSN that sets wait_timeout keeps its own). A gateway whose
// host dies or whose network partitions between a batch's two scripts sends no FIN: the
// server waits, inside the transaction and holding its users' locks, for a statement that
// never comes — 8 hours at the server's default, during which every other gateway's admission
// of those users fails its lock wait. Then it drops the connection and rolls back.
const SessionWaitTimeout = 3 * time.Minute

// Open connects to MySQL with the settings the money code relies on: UTC sessions (so NOW(6)
// and UTC_DATE() agree on the day a charge lands on), parsed DATETIMEs, parameters
// interpolated client-side to save a round trip per statement, several statements per round
// trip (the batch writer sends its reads in one and its writes and COMMIT in another; every
// value in them is a parameter, never spliced text), and READ COMMITTED.
//
// READ COMMITTED because under REPEATABLE READ the day ledger's write of a row that may not
// exist yet (an upsert now; an UPDATE, then an INSERT if no row, when this was measured) takes
// gap locks, and the first charges of the day of users whose ledger rows are neighbours in the
// index deadlock each other (measured: 578 of ~3700 settlements gave up after eight retries
// with 256 connections). Every money
// transaction here begins by locking the user's row and reads after that, so each statement's
// fresh snapshot already contains everything that user's earlier transactions committed.
func Open(ctx context.Context, dsn string) (*sqlx.DB, error) {
	return openAs(ctx, dsn, defaultReadTimeout)
}

// OpenForMigrate is Open for schema changes: no client-side read timeout (unless the DSN
// sets one), because a CREATE INDEX on a table that keeps every hold ever taken, or a wait
// for another runner's migration lock, may rightly take longer than any money statement.
func OpenForMigrate(ctx context.Context, dsn string) (*sqlx.DB, error) {
	return openAs(ctx, dsn, 0)
}

// OpenForReports is Open for an operator's command that reads whole tables (`gateway audit`,
// `gateway report`): no client-side read timeout unless the DSN sets one. Their statements
// group every settled hold before sending a row, which on millions of holds takes longer than
// defaultReadTimeout: the audit failed outright ("invalid connection") on a million. The
// command's own deadline, and Ctrl-C, bound them instead (the driver closes the connection
// when the context ends).
func OpenForReports(ctx context.Context, dsn string) (*sqlx.DB, error) {
	return openAs(ctx, dsn, 0)
}

// defaultReadTimeout bounds one reply when the DSN does not say otherwise. A variable only so
// that a test can shorten it.
var defaultReadTimeout = 30 * time.Second

func openAs(ctx context.Context, dsn string, readTimeout time.Duration) (*sqlx.DB, error) {
	db, err := open(ctx, dsn, "transaction_isolation", readTimeout)
	if mysqlErrNumber(err) == errUnknownSystemVariable {
		// MariaDB before 11.1 knows the setting only by its old name.
		db, err = open(ctx, dsn, "tx_isolation", readTimeout)
	}
	return db, err
}

// lockWaitSeconds bounds a lock wait (InnoDB's default is 50 s). Money transactions hold a
// user's lock for milliseconds, so a long wait means a stuck transaction — and a caller whose
// deadline passed has only closed its socket: the server keeps its statement waiting, and the
// locks its transaction already took held, until the wait ends. A lock timeout is retried like
// a deadlock (DESIGN §3).
const lockWaitSeconds = 3

// errUnknownSystemVariable is MySQL's "Unknown system variable".
const errUnknownSystemVariable = 1193

func open(ctx context.Context, dsn, isolationVar string, readTimeout time.Duration) (*sqlx.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		// Not wrapped: the driver's message quotes the part it could not read, which can be
		// the password (one holding '/', with no /dbname after the address).
		return nil, errors.New("mysql_dsn cannot be parsed: expected user:password@tcp(host:port)/dbname")
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	cfg.MultiStatements = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	if _, ok := cfg.Params["innodb_lock_wait_timeout"]; !ok {
		cfg.Params["innodb_lock_wait_timeout"] = strconv.Itoa(lockWaitSeconds)
	}
	if _, ok := cfg.Params["wait_timeout"]; !ok {
		cfg.Params["wait_timeout"] = strconv.Itoa(int(SessionWaitTimeout / time.Second))
	}
	cfg.Params[isolationVar] = "'READ-COMMITTED'"
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = readTimeout
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql connector: %w", err)
	}
	db := sqlx.NewDb(sql.OpenDB(connector), "mysql")
	db.SetMaxOpenConns(maxOpenConns)
	db.SetMaxIdleConns(maxOpenConns)
	db.SetConnMaxLifetime(connMaxLifetime)
	db.SetConnMaxIdleTime(connMaxIdleTime)
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql %s@%s: %w", cfg.User, cfg.Addr, err)
	}
	return db, nil
}
