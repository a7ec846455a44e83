package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
// outside a transaction (the session's wait_timeout; a DSN that sets wait_timeout keeps its
// own): the server's default, 8 hours, keeps a dead host's connections for that long.
const SessionWaitTimeout = 3 * time.Minute

// SessionIdleTransactionTimeout bounds how long the server keeps a transaction open for a
// client that has gone silent inside it (MariaDB's idle_transaction_timeout; a DSN that sets
// it keeps its own, 0 for none): it then drops the connection, rolls the transaction back and
// frees its locks. A gateway paused (SIGSTOP, a VM's live migration, a debugger), partitioned
// without a FIN reaching the server, or on a host that died, between a batch's two scripts
// holds its users' rows locked: every other gateway's admission of those users fails its lock
// wait, retried, and is refused 503 at admit_timeout, until the server lets go. Without this
// bound that was wait_timeout for a dead host and the whole pause for a paused one.
//
// Shorter than a lock wait (lockWaitSeconds): an admission that waits on such a transaction's
// row, which the transaction took before it went silent, gets it within its first wait, so a
// stopped gateway delays its users' admissions elsewhere by this much and refuses none. No
// transaction of the gateway is silent by design (between its statements it only computes:
// milliseconds, a few hundred under the heaviest load measured), so seconds of silence mean it
// is gone. One that was only slow finds its connection gone at its next statement: the driver
// reports it as not sent (driver.ErrBadConn) when it could write none of it, and the batch is
// tried again; when the write went out and the reply is what failed (the usual case, the
// socket's buffer takes the write), it is an unanswered commit, which the batch's tokens
// resolve on the retry (tryWriteBatch). MySQL has no such setting: there the bound is
// wait_timeout.
const SessionIdleTransactionTimeout = 2 * time.Second

// IdleTransactionBound is how long the server lets a session of db sit silent inside a
// transaction before it ends it (SessionIdleTransactionTimeout unless the DSN says otherwise),
// or 0 when it never does (MySQL has no such setting; a DSN may set 0): a gateway paused
// inside a transaction then holds its users' rows for the whole pause. serve warns of it.
func IdleTransactionBound(ctx context.Context, db *sqlx.DB) (time.Duration, error) {
	var seconds int64
	err := db.GetContext(ctx, &seconds, "SELECT @@SESSION.idle_transaction_timeout")
	if mysqlErrNumber(err) == errUnknownSystemVariable {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read idle_transaction_timeout: %w", err)
	}
	return time.Duration(seconds) * time.Second, nil
}

// ReadOnlyBypass lists the privileges of db's account, granted to the account itself, with
// which the server's read_only does not bind it: SUPER and, on MariaDB 10.11, READ_ONLY ADMIN
// (CONNECTION_ADMIN on MySQL 8). A primary demoted by a failover, or set read_only for
// maintenance, refuses the gateway's writes only when this is empty; with any of them it takes
// them, beside the promoted server. serve warns of it.
func ReadOnlyBypass(ctx context.Context, db *sqlx.DB) ([]string, error) {
	// USER_PRIVILEGES names an account 'user'@'host'; CURRENT_USER() says user@host (the host
	// after the last @).
	var privs []string
	err := db.SelectContext(ctx, &privs, `SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES
		WHERE GRANTEE = CONCAT('''', LEFT(CURRENT_USER(), LENGTH(CURRENT_USER()) - LENGTH(SUBSTRING_INDEX(CURRENT_USER(), '@', -1)) - 1),
			'''@''', SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')
		AND PRIVILEGE_TYPE IN ('SUPER', 'READ_ONLY ADMIN', 'CONNECTION_ADMIN')
		ORDER BY PRIVILEGE_TYPE`)
	if err != nil {
		return nil, fmt.Errorf("read the account's privileges: %w", err)
	}
	return privs, nil
}

// Open connects to MySQL with the settings the money code relies on: UTC sessions (so NOW(6)
// and UTC_DATE() agree on the day a charge lands on), parsed DATETIMEs, parameters
// interpolated client-side to save a round trip per statement, several statements per round
// trip (the batch writer sends its reads in one and its writes and COMMIT in another; every
// value in them is a parameter, never spliced text), affected rows counted as changed rather
// than matched, and READ COMMITTED.
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
	s := sessionVars{isolation: "transaction_isolation", idleTransactionTimeout: true}
	for {
		db, err := open(ctx, dsn, s, readTimeout)
		next, ok := s.without(unknownVariable(err))
		if !ok {
			return db, err
		}
		s = next
	}
}

// sessionVars are the session settings Open chooses by the server's version.
type sessionVars struct {
	isolation              string // the name the server knows the isolation level by
	idleTransactionTimeout bool   // set idle_transaction_timeout (MariaDB only)
}

// without is s adapted to a server that refused the variable name as unknown, and false when
// no setting of Open's own can be adapted (an unknown variable the DSN asked for is its own).
// Each adaptation is taken once, so Open tries at most three times.
func (s sessionVars) without(name string) (sessionVars, bool) {
	switch {
	case name == "transaction_isolation" && s.isolation == "transaction_isolation":
		// MariaDB before 11.1 knows the setting only by its old name.
		s.isolation = "tx_isolation"
	case name == "idle_transaction_timeout" && s.idleTransactionTimeout:
		// MySQL has no such setting.
		s.idleTransactionTimeout = false
	default:
		return s, false
	}
	return s, true
}

// unknownVariable is the name of the variable err refuses as MySQL's "Unknown system variable
// 'name'", or "".
func unknownVariable(err error) string {
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != errUnknownSystemVariable {
		return ""
	}
	_, rest, _ := strings.Cut(me.Message, "'")
	name, _, _ := strings.Cut(rest, "'")
	return strings.ToLower(name)
}

// lockWaitSeconds bounds a lock wait (InnoDB's default is 50 s). Money transactions hold a
// user's lock for milliseconds, so a long wait means a stuck transaction — and a caller whose
// deadline passed has only closed its socket: the server keeps its statement waiting, and the
// locks its transaction already took held, until the wait ends. A lock timeout is retried like
// a deadlock (DESIGN §3).
const lockWaitSeconds = 3

// errUnknownSystemVariable is MySQL's "Unknown system variable".
const errUnknownSystemVariable = 1193

func open(ctx context.Context, dsn string, vars sessionVars, readTimeout time.Duration) (*sqlx.DB, error) {
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
	// Rows changed, not rows matched: a session's claim tells a new session (its upsert
	// inserted, 1) from a known one (the no-op update that locks it, 0) by that count, and a
	// DSN's clientFoundRows=true made both 1.
	cfg.ClientFoundRows = false
	// Refusals read_only are the store's to tell (isReadOnly): waited out, and the refused
	// connection dropped with every idle one (dropReadOnly). A DSN's rejectReadOnly=true made
	// the driver answer them driver.ErrBadConn, a connection found broken before anything was
	// sent: a batch's retries drew the pool's other connections to the demoted server one by
	// one, and a user's or key's creation failed at once.
	cfg.RejectReadOnly = false
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	setParam(cfg.Params, "time_zone", "'+00:00'")
	setParamDefault(cfg.Params, "innodb_lock_wait_timeout", strconv.Itoa(lockWaitSeconds))
	setParamDefault(cfg.Params, "wait_timeout", strconv.Itoa(int(SessionWaitTimeout/time.Second)))
	if vars.idleTransactionTimeout {
		setParamDefault(cfg.Params, "idle_transaction_timeout", strconv.Itoa(int(SessionIdleTransactionTimeout/time.Second)))
	}
	setParam(cfg.Params, vars.isolation, "'READ-COMMITTED'")
	// Every statement outside a transaction the code begins is whole on its own (a user's
	// creation, a run call's record, a hold's extension, a heartbeat): under a DSN's
	// autocommit=0 each opened a transaction that nothing committed, rolled back when its
	// connection ended (or idle_transaction_timeout ended it), its row locks held till then.
	setParam(cfg.Params, "autocommit", "1")
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

// setParamDefault sets the session variable name unless the DSN sets it. The server reads
// variable names in any case, so the DSN's may be in any: matched exactly, a DSN's
// WAIT_TIMEOUT and Open's wait_timeout were both sent, and either won.
func setParamDefault(params map[string]string, name, value string) {
	for k := range params {
		if strings.EqualFold(k, name) {
			return
		}
	}
	params[name] = value
}

// setParam sets the session variable name whatever the DSN says, under any case, since the
// money code relies on its value.
func setParam(params map[string]string, name, value string) {
	for k := range params {
		if strings.EqualFold(k, name) {
			delete(params, k)
		}
	}
	params[name] = value
}
