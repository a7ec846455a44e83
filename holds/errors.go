package holds

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"

	"github.com/go-sql-driver/mysql"
)

// Refusals of admission. The proxy maps each to its HTTP answer.
var (
	ErrUnknownUser  = errors.New("unknown user")
	ErrUserDisabled = errors.New("user disabled")
	ErrInsufficient = errors.New("insufficient credits")
	ErrRunSettled   = errors.New("run already settled")
	ErrRunNotFound  = errors.New("run not found")
	// errUserGone is ErrRunNotFound for a settlement whose hold is there but whose user's row
	// is gone (deleted by hand: no foreign key): the reconciler counts such holds apart, as
	// only restoring the user settles them, where a hold deleted or replaced since its scan
	// read it needs nothing.
	errUserGone = fmt.Errorf("%w: its user's row is gone", ErrRunNotFound)
	// ErrInvalidModel refuses an admission whose model name is not UTF-8 text: the utf8mb4
	// column would refuse the bytes, and with them every other item of the batch.
	ErrInvalidModel = errors.New("model name is not UTF-8 text")
)

// InDebtError refuses an admission as ErrInsufficient does (it wraps it), for a user whose
// prepaid credits are below zero: calls that cost more than what was left made a debt (the
// bounded overdraft, DESIGN §2), which stays until a grant pays it and meanwhile takes its size
// off every day's allowance. Told apart so that the refusal can say so: a user refused on a new
// day's first call has not used today's allowance, and waiting for tomorrow helps only when the
// allowance is larger than the debt.
type InDebtError struct{ DebtMicro int64 }

func (e *InDebtError) Error() string {
	return fmt.Sprintf("%v: prepaid credits %d µUSD below zero", ErrInsufficient, e.DebtMicro)
}

func (e *InDebtError) Unwrap() error { return ErrInsufficient }

// insufficient is the refusal of an admission the user's balance cannot pay: InDebtError for a
// user in debt, else ErrInsufficient.
func insufficient(prepaidMicro int64) error {
	if prepaidMicro < 0 {
		return &InDebtError{DebtMicro: -prepaidMicro}
	}
	return ErrInsufficient
}

// ErrRunStillLive refuses a Settlement with OnlyIfExpired whose hold has not expired under its
// row lock: a call of its run pushed its expiry out after the reconciler read it.
var ErrRunStillLive = errors.New("run has not expired")

// ErrOutcomeUnknown is an admission whose writes and COMMIT were sent and never answered: the
// database may have committed its hold. Its caller should release it (a settlement at 0 with
// the admission's token, harmless when there is none). A failed batch whose settlements' writes
// were so sent is ErrOutcomeUnknown too: its runs may be settled.
var ErrOutcomeUnknown = errors.New("outcome unknown: the commit was sent but not answered")

// OutcomeUnknownError is a batch with admissions that failed after some of its commits went
// unanswered (Runs may be empty: only its settlements' writes went out). Only the admissions in
// Runs are ErrOutcomeUnknown (Writer.Admit tells each its own); the rest of the batch's
// admissions failed with nothing committed.
type OutcomeUnknownError struct {
	Runs map[string]bool // the admissions that may have been committed
	Err  error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("%v (%d admissions' commits unanswered)", e.Err, len(e.Runs))
}

func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// forRun is the error the admission of runID gets: ErrOutcomeUnknown if it may have been
// committed, the batch's plain failure otherwise.
func (e *OutcomeUnknownError) forRun(runID string) error {
	if e.Runs[runID] {
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, e.Err)
	}
	return e.Err
}

// ErrAdmitNotStarted is an admission that no worker took before its deadline: nothing was held.
var ErrAdmitNotStarted = errors.New("admission not started before its deadline")

// ErrSettleQueued is a settlement whose caller stopped waiting before a worker took it: it has
// not run yet, and commits (or fails) in a later batch. Its caller cannot tell which.
var ErrSettleQueued = errors.New("settlement still queued")

// errBatchPanicked is a batch whose building or reading panicked (Writer.writeBatch): most
// likely one item's fault, an item refusal (isItemRefusal).
var errBatchPanicked = errors.New("batch panicked")

// isItemRefusal is a batch's error that is most likely one of its items' fault, and that left
// nothing of the batch committed: a statement the database refused for what it holds (a value
// out of range, a duplicate key, a foreign key, a string too long), not for a reason of its
// own (isUnavailable: an outage, a statement it ended, read_only, a full disk), nor a conflict
// the retries did not outlast, nor a COMMIT sent unanswered (the refused statement stopped its
// script before the COMMIT); or a panic while building the batch. The Writer splits a batch so
// refused to find the item at fault, rather than fail every item with it.
func isItemRefusal(err error) bool {
	if errors.Is(err, errBatchPanicked) {
		return true
	}
	var unknown *OutcomeUnknownError
	if mysqlErrNumber(err) == 0 || isConflict(err) || isUnavailable(err) || isOutOfRoom(err) ||
		errors.Is(err, ErrOutcomeUnknown) || errors.As(err, &unknown) {
		return false
	}
	return true
}

// ErrBatcherClosed is returned to requests offered to a Writer or a KeyLookup after Close.
var ErrBatcherClosed = errors.New("batcher closed")

// TooManyInFlightError refuses an admission past the user's in-flight limit. OpenRuns is how
// many of the holds in flight are named runs: each keeps its slot between its calls until it is
// settled or expires, so a caller whose slots they hold must be told to settle them, not that a
// call will soon finish.
type TooManyInFlightError struct {
	InFlight, Limit int
	OpenRuns        int
}

func (e *TooManyInFlightError) Error() string {
	return fmt.Sprintf("too many calls in flight: %d of %d", e.InFlight, e.Limit)
}

// MySQL error numbers this package reacts to.
const (
	errDupEntry        = 1062
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
)

func mysqlErrNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

func isDuplicate(err error) bool { return mysqlErrNumber(err) == errDupEntry }

// isConflict is a transaction another transaction beat: running it again will succeed.
func isConflict(err error) bool {
	n := mysqlErrNumber(err)
	return n == errDeadlock || n == errLockWaitTimeout
}

// Server errors that end a statement, or refuse a connection, for a reason of the server's
// own rather than the statement's: nothing in the statement was wrong, and it may run a moment
// later.
const (
	errTooManyConnections     = 1040 // ER_CON_COUNT_ERROR: max_connections reached
	errServerShutdown         = 1053 // ER_SERVER_SHUTDOWN: the server is stopping
	errTooManyUserConnections = 1203 // ER_TOO_MANY_USER_CONNECTIONS: max_user_connections reached
	errUserLimitReached       = 1226 // ER_USER_LIMIT_REACHED: the account's own MAX_USER_CONNECTIONS (or hourly) limit
	errQueryInterrupted       = 1317 // ER_QUERY_INTERRUPTED: KILL QUERY
	errConnectionKilled       = 1927 // ER_CONNECTION_KILLED (MariaDB): KILL CONNECTION, when its answer gets out
	errStatementTimeout       = 1969 // ER_STATEMENT_TIMEOUT (MariaDB): max_statement_time
)

// isEndedByServer is a statement the server ended (a kill, its shutdown, a statement timeout)
// or a connection it refused for want of room.
func isEndedByServer(err error) bool {
	switch mysqlErrNumber(err) {
	case errTooManyConnections, errServerShutdown, errTooManyUserConnections, errUserLimitReached,
		errQueryInterrupted, errConnectionKilled, errStatementTimeout:
		return true
	}
	return false
}

// serverEndedError is a batch's error whose statement the server ended, or whose connection it
// refused, for a reason of its own (isEndedByServer): the batch is tried again as if the
// database were out of reach, and a closing script so ended counts as unanswered (see
// tryWriteBatch). A server runs a script's statements in order and stops at the first that
// fails, so a kill reported for one before the COMMIT leaves nothing committed; but a kill that
// lands as the COMMIT ends may be reported in its place (MySQL 8 does so).
//
// Only batches are marked so: their statements are short and bounded by the batch's deadline,
// and a kill of one is a kill of a lock wait, which the next try may not meet. A report or a
// listing that an operator kills, or that outlasts max_statement_time, stays ended: run
// again, it would cost the database what the kill was meant to spare it.
type serverEndedError struct{ err error }

func (e *serverEndedError) Error() string { return e.err.Error() }
func (e *serverEndedError) Unwrap() error { return e.err }

// endedByServer marks a batch's err as a serverEndedError when isEndedByServer says so, and
// as a readOnlyError when isReadOnly does.
func endedByServer(err error) error {
	switch {
	case isEndedByServer(err):
		return &serverEndedError{err: err}
	case isReadOnly(err):
		return &readOnlyError{err: err}
	}
	return err
}

// Server errors that refuse a write because the server, or the session's transactions, take
// none. Either names the same moment: a primary demoted by a failover, or set read_only for
// maintenance, as the gateway's account sees it (read_only binds an account without SUPER, or
// READ_ONLY ADMIN on MariaDB 10.11 and later). MariaDB refuses a locking read (FOR UPDATE) so
// too, a write at its start and a COMMIT of a transaction that wrote (before it commits, after
// blocking the read lock's taking, and rolls the transaction back).
//
// A Galera node refuses every statement so (1047) while it is out of its cluster's primary
// component (a partition, a node rejoining) or set to reject queries for maintenance
// (wsrep_reject_queries), checked before the statement runs, a COMMIT included: the same moment
// for the gateway, its node taking writes again once it rejoins, or the address leading to
// another node.
const (
	errOptionPreventsStatement = 1290 // ER_OPTION_PREVENTS_STATEMENT: --read-only (--super-read-only on MySQL)
	errReadOnlyTransaction     = 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: the session's transactions are read only
	errWsrepNotReady           = 1047 // ER_UNKNOWN_COM_ERROR: "WSREP has not yet prepared node for application use"
)

// isReadOnly is a statement refused because the server, or the session, takes no writes.
// ER_OPTION_PREVENTS_STATEMENT names other options too (secure_file_priv, skip-grant-tables),
// which no statement of a batch meets; ER_UNKNOWN_COM_ERROR otherwise answers only a protocol
// command the server does not know, which the driver never sends.
func isReadOnly(err error) bool {
	n := mysqlErrNumber(err)
	return n == errOptionPreventsStatement || n == errReadOnlyTransaction || n == errWsrepNotReady
}

// readOnlyError is a batch's error whose statement the server refused for taking no writes
// (isReadOnly). The batch is tried again, as if the database were out of reach, until its
// deadline: a failover demotes a primary for the seconds it takes to promote another (and to
// point the gateway's address at it), and failed at once, each admission of those seconds was
// refused 503 and each settlement left to the reconciler, a hold's expiry later. Unlike a
// serverEndedError it never counts as unanswered: the server refuses a write before it runs
// and a COMMIT before it commits, rolling the transaction back, so nothing of the attempt
// committed (TestCommitRefusedReadOnlyAfterTheWritesIsRetried).
type readOnlyError struct{ err error }

func (e *readOnlyError) Error() string { return e.err.Error() }
func (e *readOnlyError) Unwrap() error { return e.err }

// Server errors that refuse a write for want of room on the database's disk: a table that must
// grow (a new row, or a row that outgrows its page) on a full file system, 1114 at once on
// MariaDB 10.11; 1021 where the server reports the full disk rather than waiting for room.
const (
	errDiskFull  = 1021 // ER_DISK_FULL
	errTableFull = 1114 // ER_RECORD_FILE_FULL: "The table … is full"
)

// isOutOfRoom is a statement refused for want of room on the database's disk.
func isOutOfRoom(err error) bool {
	n := mysqlErrNumber(err)
	return n == errDiskFull || n == errTableFull
}

// outOfRoomError is the error of a batch of settlements alone whose statement the server
// refused for want of room (isOutOfRoom). The batch is tried again, as if the database were
// out of reach, until its deadline (settle_timeout): the refused statement stopped the
// script before its COMMIT, so nothing of the attempt committed (like readOnlyError, it never
// counts as unanswered), and a settlement resent finds its row as the refused attempt left it.
// Failed at once, each settlement on a full disk left its hold reserved until its expiry and
// its charge to the reconciler's figures, for a disk an operator frees in a minute. A batch
// with admissions is not so marked: an admission waits for no room (it is refused 503 at once,
// nothing held), and the Writer tries the batch's settlements again alone. Work that waits
// on no call is marked so too (withRoomRetry: the reconciler's extensions).
type outOfRoomError struct{ err error }

func (e *outOfRoomError) Error() string { return e.err.Error() }
func (e *outOfRoomError) Unwrap() error { return e.err }

// isUnavailable is the database out of reach, or a batch's statement it ended for a reason of
// its own (serverEndedError), or any statement it refused for taking no writes (isReadOnly), or
// a batch of settlements it refused for want of room (outOfRoomError), as opposed to a query it
// refused for what the query is. A refusal read_only is retried by
// withRetry like an outage, in every transaction of the store, not batches alone: a grant, a
// session's claim, a key's revocation. Failed at once, a failover's switch of seconds refused
// them (the admin API answered 500), while the admissions around them waited it out; and since
// the refused statement did not run, the retry cannot apply anything twice.
func isUnavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	var oe *net.OpError
	var se *serverEndedError
	var ro *readOnlyError
	var room *outOfRoomError
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.As(err, &oe) || errors.As(err, &ne) || errors.As(err, &se) || errors.As(err, &ro) || isReadOnly(err) ||
		errors.As(err, &room)
}

// IsUnavailable reports whether err means MySQL could not be reached, ended a batch's
// statement for a reason of its own, or refused a write read_only, for the proxy's and the
// admin API's 503.
func IsUnavailable(err error) bool { return isUnavailable(err) }

// IsOutOfRoom reports whether err is a write the database refused for want of room on its
// disk (1114 table full, 1021 disk full), waited out until the caller's deadline: the admin
// API's 503 with a longer Retry-After than an outage's, since an operator must free room.
func IsOutOfRoom(err error) bool { return isOutOfRoom(err) }

// IsBusy reports whether err means MySQL was reached but could not answer in time: a lock wait
// or deadlock the store's retries did not outlast, or a deadline that ran out waiting (for the
// admin API's 503, rather than 500: the request itself may be fine).
func IsBusy(err error) bool { return isConflict(err) || errors.Is(err, context.DeadlineExceeded) }
