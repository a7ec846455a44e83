// Package holds keeps what is owed: accounts, holds, the day ledger and grants, in MySQL.
//
// Every money transaction locks rows in one global order, users -> run_holds -> usage_days,
// and starts by locking the user's row. That one rule is what makes admission see every hold
// and settlement that committed before it, and what keeps two money paths from deadlocking.
//
// Transactions run at READ COMMITTED (see Open): every read after the user lock sees what the
// user's earlier transactions committed, and no gap locks couple one user's ledger insert to
// another's.
//
// The package does four jobs, one file group each, and keeps them together on purpose: each
// writes the same rows under the same lock order, through the same retries on a lost
// connection, a killed statement, a read-only spell or a full disk (store.go, errors.go,
// open.go), and the statements that settle a hold, find the expired ones or bring in a dead
// process's are unexported: other packages reach them only through the Store's operations,
// the Writer and the Reconciler, which apply the conditional updates that make each count
// once. Splitting the reconciler out would export them.
//   - Calls' money: admissions and settlements in shared batch transactions (writer.go,
//     batch.go, admit.go, settle.go; a named run's calls, runs.go, sessions.go).
//   - What a dead process left: the reconciler and the fleet's heartbeats (reconcile.go,
//     reconcile_dead.go, instances.go, instance_list.go).
//   - Accounts: users, keys (and their batched lookup), grants, plans and the credit unit
//     recorded in the database, with the fleet's Redis prefix and longest TTLs (accounts.go,
//     admin.go, keys.go, batcher.go, keys_admin.go, grants.go, plan_terms.go, credit_unit.go,
//     fleet_redis.go, fleet_record.go).
//   - Books: the usage report, run listings, the audit and pruning (usage_report.go,
//     run_list.go, audit.go, prune.go).
package holds

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
)

// maxListRows bounds what one listing reads (a page of users, keys, grants or runs, one pass of
// the reconciler's scan): no request reads a table whole. The admin API asks for less
// (admin.MaxListLimit, plus one to learn whether a page follows).
const maxListRows = 10_000

// MoneyLog names the logger of lines that record what a run or an account was charged or
// given (the reconciler's settlements, grants, a lost admission's release): the gateway's
// logger never samples them, however many come in a second.
const MoneyLog = "money"

// Plan is what a class of users gets, in micro-USD.
type Plan struct {
	AllowanceMicro  int64 // per UTC day
	HoldNormalMicro int64
	HoldHeavyMicro  int64
	HeavyAfterTurns int // user turns that make a call heavy
	MaxInFlight     int
	MaxRunCostMicro int64
	DiscountBP      int
}

// Store is the MySQL side of billing.
type Store struct {
	db          *sqlx.DB
	plans       map[string]Plan
	defaultPlan string
	log         *zap.Logger
	retry       RetryPolicy
	onSettled   SettledHook
}

// NewStore wires a store. defaultPlan names the plan used for a user whose plan is unknown.
func NewStore(db *sqlx.DB, plans map[string]Plan, defaultPlan string, log *zap.Logger) *Store {
	if _, ok := plans[defaultPlan]; !ok {
		panic(fmt.Sprintf("holds: default plan %q not configured", defaultPlan))
	}
	return &Store{db: db, plans: plans, defaultPlan: defaultPlan, log: log, retry: defaultRetry}
}

// DB exposes the handle for tests and tools.
func (s *Store) DB() *sqlx.DB { return s.db }

// SettledHook is told of each settlement a batch of this store committed, once, after the
// commit: what a process's metrics count as charged (the day ledger is the record). It runs
// on the batch's goroutine, before the batch's callers are answered, so it must not block.
type SettledHook func(Settlement, Settled)

// OnSettled sets the store's SettledHook. Call it before the store is used.
func (s *Store) OnSettled(h SettledHook) { s.onSettled = h }

// RetryPolicy bounds how hard a money transaction tries. Deadlocks and lock timeouts are
// retried at once (the other transaction has finished), at most MaxConflictRetries times; an
// unreachable server (or one refusing a batch of settlements for want of room: outOfRoomError)
// is retried with backoff (InitialBackoff, doubling up to MaxBackoff) until the caller's
// context ends, after which settlement is left to the reconciler.
type RetryPolicy struct {
	MaxConflictRetries int
	InitialBackoff     time.Duration
	MaxBackoff         time.Duration
}

// defaultRetry is the policy NewStore starts with (tests shorten it: SetRetry).
var defaultRetry = RetryPolicy{MaxConflictRetries: 8, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 2 * time.Second}

// CheckWritable reports whether the database takes the writes calls make. A write, not a PING:
// a MariaDB set read_only (a primary demoted by a failover, or put there for maintenance)
// answers PING and reads, and refuses every hold. The server refuses this statement as it
// refuses the calls' writes, before it reads anything; otherwise its WHERE is impossible, so
// it touches no row, takes no row lock and writes no binary log event (a WHERE that merely
// matched nothing was logged in MIXED format).
//
// A connection refused so leaves the pool with every idle one (dropReadOnly): kept, the next
// checks were made on it, and a gateway taken out of rotation for it stayed out after a
// failover had switched its address to a writable primary.
func (s *Store) CheckWritable(ctx context.Context) error {
	conn, err := s.db.Connx(ctx)
	if err != nil {
		return fmt.Errorf("write check: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "UPDATE users SET id = id WHERE 1 = 0"); err != nil {
		if isReadOnly(err) {
			s.dropReadOnly(conn)
		} else {
			_ = conn.Close()
		}
		return fmt.Errorf("write check: %w", err)
	}
	_ = conn.Close()
	return nil
}

// dropReadOnly discards conn, which the server refused a write as taking none (isReadOnly),
// and closes every idle connection of the pool with it. After a failover they all lead to the
// demoted primary, while a new connection, dialled through the switched address (DNS, a
// proxy), reaches the promoted one. Put back, they were handed out again — the pool hands out
// the connection returned last, so a batch's retries met the same refusal until its deadline —
// until their lifetime (connMaxLifetime) ran out. On a server merely set read_only the new
// connections are refused alike, each a dial, at most once per retry of a batch.
func (s *Store) dropReadOnly(conn *sqlx.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
	s.closeIdle()
}

// closeIdle closes every idle connection of the pool; the bound then is Open's again.
func (s *Store) closeIdle() {
	s.db.SetMaxIdleConns(0)
	s.db.SetMaxIdleConns(maxOpenConns)
}

// execUntilWritable runs one autocommit statement, tried again with the store's backoff while
// the server refuses it read_only (isReadOnly) or for want of room on the database's disk
// (isOutOfRoom: 1114, 1021), until ctx ends; any other error is returned at once. A refusal is
// known not to have landed — the server refuses a write before it runs, and an autocommit
// statement that fails is rolled back whole — so a statement that adds (CreateKey,
// CreateUser) is safe to send again after one, as it is not after a lost reply. Each connection
// refused read_only leaves the pool (dropReadOnly), so the next try dials anew: after a
// failover's switch of address, the promoted primary; one refused for room goes back to it,
// the server being the right one, its disk full. fields go on each retry's log line (a run's
// id). Past ctx's end the error is the last refusal's (IsOutOfRoom tells a full disk apart).
func (s *Store) execUntilWritable(ctx context.Context, what string, fields []zap.Field, q string, args ...any) (sql.Result, error) {
	backoff := s.retry.InitialBackoff
	var refused error // the last refusal, reported if ctx ends during the next try
	for attempt := 1; ; attempt++ {
		conn, err := s.db.Connx(ctx)
		if err != nil {
			return nil, gaveUp(ctx, err, refused)
		}
		res, err := conn.ExecContext(ctx, q, args...)
		full := isOutOfRoom(err)
		if err == nil || !(isReadOnly(err) || full) {
			_ = conn.Close()
			return res, gaveUp(ctx, err, refused)
		}
		msg := "database disk full, retrying"
		if full {
			_ = conn.Close()
		} else {
			s.dropReadOnly(conn)
			msg = "database unavailable, retrying"
		}
		refused = err
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (gave up: %v)", err, ctx.Err())
		}
		s.log.Warn(msg, append([]zap.Field{zap.String("op", what), zap.Int("attempt", attempt),
			zap.Duration("backoff", backoff), zap.Error(err)}, fields...)...)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (gave up: %v)", err, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, s.retry.MaxBackoff)
	}
}

// gaveUp is the error of a retry loop whose try failed with err after the earlier refusal
// refused (nil: none): once ctx has ended, the refusal it waited on, naming the deadline — a
// try that ran into the deadline fails with the context's error, which told the caller
// nothing of the full disk or read_only server it had waited on (the admin API answered it
// as busy, Retry-After: 1, a full disk's as soon as a read_only spell's) — and err otherwise.
// A statement the deadline cut may still have landed, as one whose reply was lost may: the
// error says what was waited on, not that nothing was written.
func gaveUp(ctx context.Context, err, refused error) error {
	if err == nil || ctx.Err() == nil || refused == nil || errors.Is(err, refused) {
		return err
	}
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !isUnavailable(err) {
		return err // an answer of its own (a name taken, a grant refused), not the deadline's
	}
	return fmt.Errorf("%w (gave up: %v)", refused, ctx.Err())
}

// planName is the name of the plan whose terms plan gives the user: its row's plan, or the
// default plan's when the row's is not configured. A view of those terms names this one: the
// row's name there would be a plan the user cannot look up, shown beside another's figures.
func (s *Store) planName(u userRow) string {
	if _, ok := s.plans[u.Plan]; ok {
		return u.Plan
	}
	return s.defaultPlan
}

// plan returns the user's effective plan, with per-user overrides applied.
func (s *Store) plan(u userRow) Plan {
	p, ok := s.plans[u.Plan]
	if !ok {
		p = s.plans[s.defaultPlan]
	}
	if u.AllowanceMicro.Valid {
		p.AllowanceMicro = u.AllowanceMicro.Int64
	}
	if u.DiscountBP.Valid {
		p.DiscountBP = int(u.DiscountBP.Int64)
	}
	if u.MaxInFlight.Valid {
		p.MaxInFlight = int(u.MaxInFlight.Int64)
	}
	return p
}

// userRow is the users row as money transactions read it.
type userRow struct {
	ID             uint64        `db:"id"`
	Name           string        `db:"name"`
	Plan           string        `db:"plan"`
	AllowanceMicro sql.NullInt64 `db:"allowance_micro"`
	PrepaidMicro   int64         `db:"prepaid_micro"`
	DiscountBP     sql.NullInt64 `db:"discount_bp"`
	MaxInFlight    sql.NullInt64 `db:"max_in_flight"`
	DisabledAt     sql.NullTime  `db:"disabled_at"`
}

const userColumns = "id, name, plan, allowance_micro, prepaid_micro, discount_bp, max_in_flight, disabled_at"

// lockUser takes the first lock of every money transaction.
func lockUser(ctx context.Context, tx *sqlx.Tx, userID uint64) (userRow, error) {
	var u userRow
	err := tx.GetContext(ctx, &u, "SELECT "+userColumns+" FROM users WHERE id = ? FOR UPDATE", userID)
	if errors.Is(err, sql.ErrNoRows) {
		return u, ErrUnknownUser
	}
	if err != nil {
		return u, fmt.Errorf("lock user %d: %w", userID, err)
	}
	return u, nil
}

// inTx runs fn in one transaction, retrying conflicts and outages under the store's policy
// until ctx ends. fn must be safe to run again from the start.
func (s *Store) inTx(ctx context.Context, what string, fn func(tx *sqlx.Tx) error) error {
	return s.withRetry(ctx, what, func() error { return s.tryTx(ctx, fn) })
}

// withRetry runs try until it succeeds or the store's RetryPolicy gives up; what names the
// operation in the retry logs. It is inTx's loop, and serves work that is not one of inTx's
// transactions too: a statement, a few, a read-only transaction of try's own, a batch
// (WriteBatch). try must be safe to run again from the start.
func (s *Store) withRetry(ctx context.Context, what string, try func() error) error {
	return s.withRetryLogged(ctx, what, nil, try)
}

// withRoomRetry is withRetryLogged that also waits out a statement refused for want of room on
// the database's disk (isOutOfRoom: 1114, 1021), with the same backoff until ctx ends (the
// retry log says "database disk full, retrying"). Such a refusal is known not to have landed:
// the refused statement ran nothing, and a transaction it stopped is rolled back before its
// COMMIT. For work that waits on nobody's call (the reconciler's, an operator's), where one
// given up at once left the work undone for a disk an operator frees in a minute, and for a
// named run's call record, which its caller's answer waits for within admit_timeout and which
// is sent again after it; an admission is refused at once instead (nothing held).
//
// A try that runs into ctx's end after a refusal fails with the context's error; the refusal
// waited on is answered in its place (gaveUp), so a full disk's is told apart (IsOutOfRoom).
func (s *Store) withRoomRetry(ctx context.Context, what string, fields []zap.Field, try func() error) error {
	var refused error
	err := s.withRetryLogged(ctx, what, fields, func() error {
		err := waitForRoom(try())
		if isUnavailable(err) {
			refused = err
		}
		return err
	})
	return gaveUp(ctx, err, refused)
}

// waitForRoom marks err, when it is a refusal for want of room, as one withRetry waits out
// (outOfRoomError); any other err is returned as it is.
func waitForRoom(err error) error {
	if isOutOfRoom(err) {
		return &outOfRoomError{err: err}
	}
	return err
}

// withRetryLogged is withRetry whose retry logs carry fields too (a batch's run ids).
func (s *Store) withRetryLogged(ctx context.Context, what string, fields []zap.Field, try func() error) error {
	backoff := s.retry.InitialBackoff
	conflicts := 0
	for attempt := 1; ; attempt++ {
		err := try()
		if err == nil {
			return nil
		}
		switch {
		case isConflict(err) && conflicts < s.retry.MaxConflictRetries:
			conflicts++
			s.log.Debug("transaction conflict, retrying", append([]zap.Field{zap.String("op", what), zap.Int("attempt", attempt),
				zap.Error(err)}, fields...)...)
			continue
		case isUnavailable(err) && ctx.Err() == nil:
			if isReadOnly(err) {
				// The refused connection is back in the pool, idle: closed with the others,
				// so the next try dials anew (dropReadOnly), not meet the demoted server again.
				s.closeIdle()
			}
			msg := "database unavailable, retrying"
			if isOutOfRoom(err) {
				msg = "database disk full, retrying"
			}
			s.log.Warn(msg, append([]zap.Field{zap.String("op", what), zap.Int("attempt", attempt),
				zap.Duration("backoff", backoff), zap.Error(err)}, fields...)...)
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (gave up: %v)", err, ctx.Err()) // callers name the operation
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, s.retry.MaxBackoff)
			continue
		}
		return err
	}
}

func (s *Store) tryTx(ctx context.Context, fn func(tx *sqlx.Tx) error) error {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
