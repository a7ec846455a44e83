package holds

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// SessionClaim is what registering a run as a session's current run decided.
type SessionClaim struct {
	// Duplicate: the session's current run is still live and was asked the same message. The
	// claim changed nothing; Current is that run, and the caller releases its own fresh hold.
	Duplicate bool
	// Current is the session's current run after the claim: the claiming run, or on Duplicate
	// the run already answering the same message.
	Current string
	// Replaced is the open run the claim took the session from (a different message, or the
	// same one past its hold's expiry): it must be cancelled, wherever it runs. Empty when the
	// previous run had ended (settled, or its answer final) or there was none.
	Replaced string
	// Superseded: an earlier attempt of this claim committed, its reply lost, and a newer
	// message's claim has taken the session from the claiming run since (Current is that
	// message's run). The claiming run is the older message: it must not run, nor take the
	// session back. Replaced is still what the committed attempt replaced, to be cancelled.
	Superseded bool
}

// ClaimSession makes runID the current run of the caller's session unless the session's
// current run is still live and was asked the same message (then it is a duplicate: a double
// click, a refresh that resent). DESIGN §6: the check and the registration are one
// transaction on the session's row, so two requests of one session can never both see
// "no duplicate". The caller has already taken runID's hold; that ordering is what lets the
// decision happen with no await in between.
//
// Locking: the upsert takes the session row's exclusive lock first (creating the row when the
// session is new); the previous run's hold is then read without a lock. Settlement never
// touches sessions, so this cannot join a cycle with the users -> run_holds -> usage_days
// order. A previous run that settles just after the read is treated as live: the worst case
// is a cancel sent to a run that already ended, or an already_running pointing at a run that
// just answered.
func (s *Store) ClaimSession(ctx context.Context, userID uint64, sessionID, runID string, messageHash [32]byte) (SessionClaim, error) {
	return s.ClaimSessionPast(ctx, userID, sessionID, runID, messageHash, "")
}

// ClaimSessionPast is ClaimSession told that the run ended has answered already (its hold
// may still await its settlement): if it is the session's current run, it counts as ended.
func (s *Store) ClaimSessionPast(ctx context.Context, userID uint64, sessionID, runID string, messageHash [32]byte, ended string) (SessionClaim, error) {
	return s.claimSession(ctx, userID, sessionID, runID, messageHash, ended, nil)
}

// ClaimSessionFrom is ClaimSession for a message whose admission waited for a settlement of
// its user's before its claim (the proxy released a hold too small for its prompt and
// admitted it again): from is the session's current run when it began to wait ("" for none).
// Another run current now, neither from nor runID, was made so by a newer message's claim
// while this one waited: this one is the older, and is answered Superseded, replacing
// nothing (a duplicate of the running message is still Duplicate). Claimed as any other, the
// older message took the session back, and the newer one, already running, was stopped and
// charged for what it used.
func (s *Store) ClaimSessionFrom(ctx context.Context, userID uint64, sessionID, runID string, messageHash [32]byte, from string) (SessionClaim, error) {
	return s.claimSession(ctx, userID, sessionID, runID, messageHash, "", &from)
}

// claimSession is ClaimSessionPast, and ClaimSessionFrom when from is set.
func (s *Store) claimSession(ctx context.Context, userID uint64, sessionID, runID string, messageHash [32]byte, ended string, from *string) (SessionClaim, error) {
	var out SessionClaim
	// retry: an earlier attempt may have committed with its reply lost; the run's own row then
	// says so (claim_replaced), and what it replaced. committing: this attempt's statements ran
	// and its COMMIT went out; still set when another attempt starts or the retries end, that
	// COMMIT failed, and whether it landed is unknown.
	retry, committing, unknown := false, false, false
	err := s.inTx(ctx, "claim session "+sessionID, func(tx *sqlx.Tx) error {
		unknown = unknown || committing
		committing = false
		var err error
		out, err = claimSessionTx(ctx, tx, userID, sessionID, runID, messageHash, ended, from, retry)
		retry = true
		committing = err == nil
		return err
	})
	if err != nil {
		if unknown || committing {
			err = errors.Join(ErrClaimOutcomeUnknown, err)
		}
		return SessionClaim{}, fmt.Errorf("claim session %s for %s: %w", sessionID, runID, err)
	}
	return out, nil
}

// ErrClaimOutcomeUnknown marks a failed session claim one of whose attempts sent its COMMIT
// and got no answer: that attempt may have committed, and replaced a live run nobody was told
// to stop. The claiming run's row says it (SessionClaimOf) once the database answers again.
var ErrClaimOutcomeUnknown = errors.New("an attempt's COMMIT went unanswered: the claim may have committed")

// claimSessionTx is one attempt of ClaimSessionPast; retry says an earlier one was made.
//
// A claim that moves the session to runID writes what it replaced in runID's own row
// (claim_replaced), in the same transaction. When the reply to its COMMIT is lost, the retry
// cannot tell from the session's row alone whether that attempt committed: a newer message's
// claim may have moved the session on since, and the retry then took the session back from
// it (both messages ended up stopped), or gave up on its context the newer message cancelled,
// and either way the run the first attempt replaced was never cancelled and ran to its end,
// charged beside the newer messages. The row says it exactly: a committed attempt answers
// what it replaced (to be cancelled: a committed claim replaced it), and one that lost the
// session since answers Superseded instead of taking it back. A retry that finds no record
// claims afresh; what an attempt that did not commit saw is never cancelled.
//
// from, when set, is ClaimSessionFrom's: the session's current run when the claiming message
// began to wait.
func claimSessionTx(ctx context.Context, tx *sqlx.Tx, userID uint64, sessionID, runID string, hash [32]byte, ended string, from *string,
	retry bool) (SessionClaim, error) {
	// A new session: the insert is the claim. An existing one: the no-op update locks its row.
	res, err := tx.ExecContext(ctx, `
		INSERT INTO sessions (user_id, session_id, current_run_id, message_hash, updated_at)
		VALUES (?, ?, ?, ?, NOW(6))
		ON DUPLICATE KEY UPDATE session_id = session_id`, userID, sessionID, runID, hash[:])
	if err != nil {
		return SessionClaim{}, fmt.Errorf("upsert session: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if _, err := tx.ExecContext(ctx, `UPDATE run_holds SET claim_replaced = '' WHERE run_id = ?`, runID); err != nil {
			return SessionClaim{}, fmt.Errorf("record claim: %w", err)
		}
		return SessionClaim{Current: runID}, nil
	}
	var row struct {
		Current string `db:"current_run_id"`
		Hash    []byte `db:"message_hash"`
	}
	err = tx.GetContext(ctx, &row, `SELECT current_run_id, message_hash FROM sessions
		WHERE user_id = ? AND session_id = ? FOR UPDATE`, userID, sessionID)
	if err != nil {
		return SessionClaim{}, fmt.Errorf("read session: %w", err)
	}
	if retry {
		// Read under the session's lock: a claim that moves the session writes its record
		// in the same transaction, under the same lock.
		claimed, replaced, err := claimOf(ctx, tx, runID)
		if err != nil {
			return SessionClaim{}, err
		}
		if claimed && row.Current == runID {
			return SessionClaim{Current: runID, Replaced: replaced}, nil
		}
		if claimed {
			return SessionClaim{Superseded: true, Current: row.Current, Replaced: replaced}, nil
		}
	}
	if row.Current == runID {
		// Another call of the same run: this claim replaced nothing.
		return SessionClaim{Current: runID}, nil
	}
	live, open, err := runOpen(ctx, tx, row.Current)
	if err != nil {
		return SessionClaim{}, err
	}
	live, open = live && row.Current != ended, open && row.Current != ended
	if live && bytes.Equal(row.Hash, hash[:]) {
		return SessionClaim{Duplicate: true, Current: row.Current}, nil
	}
	if from != nil && row.Current != *from {
		// A newer message claimed the session while this one waited.
		return SessionClaim{Superseded: true, Current: row.Current}, nil
	}
	out := SessionClaim{Current: runID}
	if open {
		// Open, expired or not: a call that outlives its hold's TTL still runs (until the
		// reconciler, finding its lease, extends the hold), and a claim that read it as ended
		// told nobody to stop it: it ran to its end beside the newer message, charged in full.
		// A cancel sent to a run whose process died reaches nobody and costs nothing. (A
		// duplicate is still told by live alone: an expired hold that never settles must not
		// refuse its message for good.)
		out.Replaced = row.Current
	}
	if _, err := tx.ExecContext(ctx, `UPDATE sessions SET current_run_id = ?, message_hash = ?, updated_at = NOW(6)
		WHERE user_id = ? AND session_id = ?;
		UPDATE run_holds SET claim_replaced = ? WHERE run_id = ?`, runID, hash[:], userID, sessionID, out.Replaced, runID); err != nil {
		return SessionClaim{}, fmt.Errorf("update session: %w", err)
	}
	return out, nil
}

// SessionClaimOf reports whether a claim of runID's session has committed, and what it
// replaced ("" for nothing): for a claim that failed after an attempt may have committed (its
// run superseded while it retried), whose replaced run must still be cancelled.
func (s *Store) SessionClaimOf(ctx context.Context, runID string) (claimed bool, replaced string, err error) {
	err = s.withRetry(ctx, "session claim of "+runID, func() error {
		var err error
		claimed, replaced, err = claimOf(ctx, s.db, runID)
		return err
	})
	if err != nil {
		return false, "", fmt.Errorf("session claim of %s: %w", runID, err)
	}
	return claimed, replaced, nil
}

// claimOf reads runID's claim record (claim_replaced): NULL, or no such run, is no claim.
func claimOf(ctx context.Context, q sqlx.QueryerContext, runID string) (claimed bool, replaced string, err error) {
	var rec sql.NullString
	err = sqlx.GetContext(ctx, q, &rec, `SELECT claim_replaced FROM run_holds WHERE run_id = ?`, runID)
	if errors.Is(err, sql.ErrNoRows) {
		return false, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("read claim of %s: %w", runID, err)
	}
	return rec.Valid, rec.String, nil
}

// SessionRef names a session: X-Session-Id values are scoped to their user.
type SessionRef struct {
	UserID    uint64
	SessionID string
}

// maxSessionRefsPerRead bounds one read of CurrentSessionRuns: the statement names each
// session by its primary key, and a process may serve many session calls at once.
const maxSessionRefsPerRead = 200

// CurrentSessionRuns returns the current run of each session of refs that has a row (a
// session without one has been pruned: its run had ended). A process compares them with the
// session runs it serves: one no longer current was replaced by a newer message, whose cancel
// may never have reached it (its sender killed between the claim's commit and the publish).
// Read at READ COMMITTED without locks, by primary key, maxSessionRefsPerRead at a time.
func (s *Store) CurrentSessionRuns(ctx context.Context, refs []SessionRef) (map[SessionRef]string, error) {
	out := make(map[SessionRef]string, len(refs))
	for batch := range slices.Chunk(refs, maxSessionRefsPerRead) {
		var where strings.Builder
		args := make([]any, 0, 2*len(batch))
		for i, ref := range batch {
			if i > 0 {
				where.WriteString(" OR ")
			}
			where.WriteString("(user_id = ? AND session_id = ?)")
			args = append(args, ref.UserID, ref.SessionID)
		}
		var rows []struct {
			UserID    uint64 `db:"user_id"`
			SessionID string `db:"session_id"`
			Current   string `db:"current_run_id"`
		}
		err := s.withRetry(ctx, "current session runs", func() error {
			rows = rows[:0]
			return sqlx.SelectContext(ctx, s.db, &rows,
				"SELECT user_id, session_id, current_run_id FROM sessions WHERE "+where.String(), args...)
		})
		if err != nil {
			return nil, fmt.Errorf("current runs of %d sessions: %w", len(batch), err)
		}
		for _, r := range rows {
			out[SessionRef{UserID: r.UserID, SessionID: r.SessionID}] = r.Current
		}
	}
	return out, nil
}

// OpenRuns returns which of runIDs are still open (queued or running, expired or not): a
// session claim cancels the run it replaces only if it is (SessionClaim.Replaced), and the
// session check (proxy) stops only what a claim would have. Read by primary key, without locks.
func (s *Store) OpenRuns(ctx context.Context, runIDs []string) (map[string]bool, error) {
	out := make(map[string]bool, len(runIDs))
	for batch := range slices.Chunk(runIDs, maxSessionRefsPerRead) {
		q, args, err := sqlx.In("SELECT run_id FROM run_holds WHERE run_id IN (?) AND state IN ('queued', 'running')", batch)
		if err != nil {
			return nil, fmt.Errorf("open runs of %d: %w", len(batch), err)
		}
		var open []string
		err = s.withRetry(ctx, "open runs", func() error {
			open = open[:0]
			return sqlx.SelectContext(ctx, s.db, &open, q, args...)
		})
		if err != nil {
			return nil, fmt.Errorf("open runs of %d: %w", len(batch), err)
		}
		for _, id := range open {
			out[id] = true
		}
	}
	return out, nil
}

// PruneSessions deletes up to limit sessions whose current run has settled and that no claim
// has touched for idle, and returns how many it deleted. Such a row decides nothing any more
// (a claim treats a session whose run has ended as new, as it does a session it has never
// seen), and without this every X-Session-Id ever sent would keep its row for good. idle
// spares a conversation between two of its messages a delete and a fresh insert.
//
// The candidates are found by a plain read (no locks at READ COMMITTED): the idle rows, a
// range of an index (sessions_updated), each one's run read by its primary key (a LEFT JOIN
// keeps that order whatever the statistics say). A run that is not there was pruned
// (PruneSettled deletes only settled runs, and a session points only at a run whose hold was
// taken before). The DELETE
// then names them by primary key and reads no run: a settled run stays settled, so a row
// whose current run is still the one read needs no second look at it. (A DELETE that read
// run_holds itself, in a subquery, took share locks on the run of every idle session, live
// ones included: it waited behind a batch settling such a run, and held up the next one.)
// A claim racing the delete is serialised by the row lock: it either finds the row gone and
// inserts it again, or has already pointed it at its own run or touched it, and the delete,
// which checks the row again under its lock, leaves it.
func (s *Store) PruneSessions(ctx context.Context, idle time.Duration, limit int) (int64, error) {
	var n int64
	err := s.withRetry(ctx, "prune sessions", func() error {
		n = 0
		var rows []struct {
			UserID    uint64 `db:"user_id"`
			SessionID []byte `db:"session_id"`
			RunID     string `db:"current_run_id"`
		}
		if err := s.db.SelectContext(ctx, &rows, `SELECT s.user_id, s.session_id, s.current_run_id
			FROM sessions s LEFT JOIN run_holds h ON h.run_id = s.current_run_id
			WHERE s.updated_at < NOW(6) - INTERVAL ? MICROSECOND AND (h.state = 'settled' OR h.run_id IS NULL)
			LIMIT ?`, idle.Microseconds(), limit); err != nil {
			return fmt.Errorf("find ended sessions: %w", err)
		}
		if len(rows) == 0 {
			return nil
		}
		q := make([]byte, 0, 128+len(rows)*64)
		q = append(q, "DELETE FROM sessions WHERE updated_at < NOW(6) - INTERVAL ? MICROSECOND AND ("...)
		args := make([]any, 0, 1+3*len(rows))
		args = append(args, idle.Microseconds())
		for i, r := range rows {
			if i > 0 {
				q = append(q, " OR "...)
			}
			q = append(q, "(user_id = ? AND session_id = ? AND current_run_id = ?)"...)
			args = append(args, r.UserID, r.SessionID, r.RunID)
		}
		q = append(q, ')')
		res, err := s.db.ExecContext(ctx, string(q), args...)
		if err != nil {
			return fmt.Errorf("delete ended sessions: %w", err)
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("prune sessions: %w", err)
	}
	return n, nil
}

// RunLive reports whether a run's hold is still open and unexpired (by the database clock):
// the test the fingerprint window applies before calling a request a duplicate of it. A run
// that does not exist is not live.
func (s *Store) RunLive(ctx context.Context, runID string) (bool, error) {
	var live bool
	err := s.withRetry(ctx, "run live "+runID, func() error {
		var err error
		live, err = runLive(ctx, s.db, runID)
		return err
	})
	return live, err
}

// runOpen reads a run's hold for a session's claim: open (queued or running: not settled,
// expired or not) and live (open and unexpired, as runLive). A run that does not exist is
// neither.
func runOpen(ctx context.Context, q sqlx.QueryerContext, runID string) (live, open bool, err error) {
	var row struct {
		Live bool `db:"live"`
		Open bool `db:"open"`
	}
	err = sqlx.GetContext(ctx, q, &row, `SELECT state IN ('queued', 'running') AND expires_at > NOW(6) AS live,
		state IN ('queued', 'running') AS open FROM run_holds WHERE run_id = ?`, runID)
	if errors.Is(err, sql.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("read hold %s: %w", runID, err)
	}
	return row.Live, row.Open, nil
}

func runLive(ctx context.Context, q sqlx.QueryerContext, runID string) (bool, error) {
	var live bool
	err := sqlx.GetContext(ctx, q, &live, `SELECT state IN ('queued', 'running') AND expires_at > NOW(6)
		FROM run_holds WHERE run_id = ?`, runID)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read hold %s: %w", runID, err)
	}
	return live, nil
}
