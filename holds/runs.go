package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/pricing"
)

// Run is a hold as reports and GET /v1/runs/{id} show it.
type Run struct {
	RunID         string         `db:"run_id" json:"-"`
	UserID        uint64         `db:"user_id" json:"-"`
	ClientRunID   sql.NullString `db:"client_run_id" json:"-"`
	State         State          `db:"state" json:"state"`
	HeldMicro     int64          `db:"held_micro" json:"-"`
	CapMicro      int64          `db:"cap_micro" json:"-"`
	CostMicro     int64          `db:"cost_micro" json:"-"`
	ChargedMicro  int64          `db:"charged_micro" json:"-"`
	AllowancePart int64          `db:"allowance_part_micro" json:"-"`
	PrepaidPart   int64          `db:"prepaid_part_micro" json:"-"`
	InTok         int64          `db:"in_tok" json:"-"`
	CacheReadTok  int64          `db:"cache_read_tok" json:"-"`
	CacheWriteTok int64          `db:"cache_write_tok" json:"-"`
	OutTok        int64          `db:"out_tok" json:"-"`
	// CacheWrite1hTok, AudioInTok and AudioOutTok are the parts of CacheWriteTok, InTok and
	// OutTok that were one-hour cache writes, audio input and audio output: a provider's
	// invoice lists them on lines of their own. A row of before migration 014, or written by a
	// gateway of before it, has 0.
	CacheWrite1hTok int64 `db:"cache_write_1h_tok" json:"-"`
	AudioInTok      int64 `db:"audio_in_tok" json:"-"`
	AudioOutTok     int64 `db:"audio_out_tok" json:"-"`
	Calls           int   `db:"calls" json:"-"`
	// EndedCalls counts the ended calls of a named run its row recorded, those that used
	// nothing included (Calls counts only those that used something); on an Idempotency-Key
	// attempt's row, 1 says its answer pinned the key though Redis refused to store it.
	EndedCalls   int            `db:"ended_calls" json:"-"`
	Model        string         `db:"model" json:"-"`
	DiscountBP   int            `db:"discount_bp" json:"-"`
	Estimated    bool           `db:"estimated" json:"-"`
	SettleSource sql.NullString `db:"settle_source" json:"-"`
	ExpiresAt    time.Time      `db:"expires_at" json:"-"`
	CreatedAt    time.Time      `db:"created_at" json:"-"`
	SettledAt    sql.NullTime   `db:"settled_at" json:"-"`
	// ReadAt is the database clock when Store.Run read the row (zero from other reads): the
	// clock its created_at and settled_at are on. A decision on how long ago one of them was
	// measures from it (Age), never from the gateway's clock, which may be
	// minutes off the database's.
	ReadAt time.Time `db:"read_at" json:"-"`
	// AdmitToken is the token of the admission that inserted the hold (AdmitRequest.Token),
	// read by the reconciler's scan and by Run (the other reads leave it empty): a release by
	// token that found the hold settled tells its own hold's charge by it (the gateway's
	// refund of a hold charged while its process was stopped).
	AdmitToken sql.NullString `db:"admit_token" json:"-"`
}

const runColumns = `run_id, user_id, client_run_id, state, held_micro, cap_micro, cost_micro, charged_micro,
	allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok, out_tok,
	cache_write_1h_tok, audio_in_tok, audio_out_tok, calls, ended_calls, model,
	discount_bp, estimated, settle_source, expires_at, created_at, settled_at`

// Run reads one run. A run of another user is ErrRunNotFound, the same answer as a run that
// does not exist, so run ids cannot be probed.
func (s *Store) Run(ctx context.Context, userID uint64, runID string) (Run, error) {
	var r Run
	err := s.db.GetContext(ctx, &r, "SELECT "+runColumns+", admit_token, NOW(6) AS read_at FROM run_holds WHERE run_id = ? AND user_id = ?", runID, userID)
	if errors.Is(err, sql.ErrNoRows) {
		return Run{}, ErrRunNotFound
	}
	if err != nil {
		return Run{}, fmt.Errorf("run %s: %w", runID, err)
	}
	return r, nil
}

// Age is how old the run was when Store.Run read it, by the database clock.
func (r Run) Age() time.Duration {
	if r.ReadAt.IsZero() {
		panic("holds: Run.Age of a run not read by Store.Run")
	}
	return r.ReadAt.Sub(r.CreatedAt)
}

// Extend pushes a live run's expiry to now + ttl (database time), never earlier than it is:
// the reconciler's extension by one hold TTL may land just after a later call's admission
// pushed the run out by run_ttl. It reports whether the expiry moved. It locks only the hold
// row and only for one statement, so it needs no place in the lock order.
//
// A refusal read_only (a failover's switch, maintenance), a lost connection or a lock wait is
// tried again until ctx ends (withRetry), as the reconciler's settlements are: failed at once,
// the hold stayed expired until the next pass, a reconcile period later, its pass counted as
// failed, and the user's in-flight count left the still-running call out meanwhile. The
// statement only moves the expiry forward, so one whose reply was lost is safe to send again.
// So is one refused for want of room (1114, 1021; withRoomRetry): the row changes in place, but
// the expiry it moves is a key of idx_run_holds_state_expires, whose new entry must grow the
// table once its page is full; given up at once, the hold stayed expired, its pass failed, for
// a disk an operator frees in a minute. Each try is logged with the run's id.
func (s *Store) Extend(ctx context.Context, runID string, ttl time.Duration) (bool, error) {
	var moved bool
	err := s.withRoomRetry(ctx, "extend", []zap.Field{zap.String("run_id", runID)}, func() error {
		res, err := s.db.ExecContext(ctx, `UPDATE run_holds SET expires_at = GREATEST(expires_at, NOW(6) + INTERVAL ? MICROSECOND)
			WHERE run_id = ? AND state IN ('queued', 'running')`, ttl.Microseconds(), runID)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		moved = n == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("extend %s: %w", runID, err)
	}
	return moved, nil
}

// RecordRunCall records one ended call of a named run on the run's row and pushes its expiry
// out, as Extend does. The row's figures are a durable lower bound of what the run used, beside
// the Redis tally, which is exact but lost with a Redis restart; a settlement takes whichever of
// the two has the larger cost (see Run.Recorded). A call charged an estimate (no usage report)
// marks the row estimated, and the settlement keeps that mark (appendMarkSettled), whichever
// figures it charges: the run's tokens are then not all the provider's own count. The row is
// left alone once settled: live reports false. An Idempotency-Key attempt's row records its
// one call so too when Redis refused to store its answer: the database then says it pinned.
//
// A call is recorded once however often it is sent: the figures are added in one transaction
// with the call's row in run_calls (callID, the caller's own id of the call), whose key a
// second record of the call finds taken, and that record then adds nothing. So any failure
// may be sent again — a lost reply, a statement a deadline cut, a lock wait, a refusal — as
// the row's figures are sums, and before run_calls a failure that may have landed was never
// sent again (it could have counted the call twice): a Redis restart before the run settled
// then took the call from the run's charge.
//
// Refusals for read_only (a failover, maintenance) and for want of room (1114, 1021: the
// expiry it moves is a key of idx_run_holds_state_expires, and run_calls grows), lock
// conflicts and a lost connection are tried again until ctx ends (withRoomRetry): missed, the
// row under-counted the run until it settled, and admission counts a live named run at what
// its row records, so the user's next calls were admitted against credits this one had spent.
func (s *Store) RecordRunCall(ctx context.Context, runID, callID string, ttl time.Duration, u pricing.Usage, costMicro int64, calls int, estimated bool) (bool, error) {
	if callID == "" || len(callID) > maxCallIDLen {
		panic(fmt.Sprintf("holds: call id %q of run %s out of range", callID, runID))
	}
	u = u.Clamp()
	var live bool
	err := s.withRoomRetry(ctx, "record call of "+runID, []zap.Field{zap.String("run_id", runID), zap.String("call_id", callID)}, func() error {
		var err error
		live, err = s.recordRunCallOnce(ctx, runID, callID, ttl, u, costMicro, calls, estimated)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("record call %s of %s: %w", callID, runID, err)
	}
	return live, nil
}

// maxCallIDLen is the longest call id a run's record takes (run_calls.call_id).
const maxCallIDLen = 64

// recordRunCallOnce sends a call's record in one round trip: the run's row is locked and read
// first (the lock order's run_holds before run_calls, as a settlement takes them), then the
// call's key is inserted if the run is live, and the figures are added only if that insert
// took the key. A key already there is the call recorded before, and the record adds nothing.
//
// Every statement of the script is guarded by what the ones before it found, so that the
// script is right however far the server runs it: the figures were added first, and a key
// found taken stopped the script with an error before its COMMIT, leaving the rollback to the
// client. A try the database read only after its sender had given up on it (a database
// stalled past the record's deadline, the next try sent and recorded meanwhile) had no client
// left to roll it back, and its figures were committed beside the next try's: the run's call
// counted twice (TestRecordRunCallRunAfterItsClientLeftIsCountedOnce).
func (s *Store) recordRunCallOnce(ctx context.Context, runID, callID string, ttl time.Duration, u pricing.Usage, costMicro int64, calls int, estimated bool) (live bool, err error) {
	conn, err := s.db.Connx(ctx)
	if err != nil {
		return false, fmt.Errorf("connection: %w", endedByServer(err))
	}
	committed := false
	defer func() { s.releaseConn(conn, committed, err) }()

	var sc script
	sc.add("START TRANSACTION")
	// Session variables outlive the script on a pooled connection: each is set before it is read.
	sc.add("SET @tg_run_live = 0, @tg_call_new = 0")
	sc.add("SELECT state IN ('queued', 'running') INTO @tg_run_live FROM run_holds WHERE run_id = ? FOR UPDATE", runID)
	// Read under the run's row lock, which every record of the run takes first: no other send
	// of the call can insert its key between this read and the insert. (ROW_COUNT() after the
	// insert proved no guide: in a script whose client had gone, run after a SELECT ... INTO,
	// it did not say the insert took the key, and a late record's figures were lost.)
	sc.add("SELECT COUNT(*) = 0 AND @tg_run_live = 1 INTO @tg_call_new FROM run_calls WHERE run_id = ? AND call_id = ?", runID, callID)
	sc.add("INSERT INTO run_calls (run_id, call_id) SELECT ?, ? FROM DUAL WHERE @tg_call_new = 1", runID, callID)
	sc.add(`UPDATE run_holds SET expires_at = GREATEST(expires_at, NOW(6) + INTERVAL ? MICROSECOND),
		in_tok = in_tok + ?, cache_read_tok = cache_read_tok + ?, cache_write_tok = cache_write_tok + ?, out_tok = out_tok + ?,
		cache_write_1h_tok = cache_write_1h_tok + ?, audio_in_tok = audio_in_tok + ?, audio_out_tok = audio_out_tok + ?,
		cost_micro = cost_micro + ?, calls = calls + ?, ended_calls = ended_calls + 1, estimated = GREATEST(estimated, ?)
		WHERE run_id = ? AND state IN ('queued', 'running') AND @tg_call_new = 1`, ttl.Microseconds(),
		u.Input, u.CacheRead, u.CacheWrite, u.Output, u.CacheWrite1h, u.AudioInput, u.AudioOutput, costMicro, calls, estimated, runID)
	sc.add("COMMIT")
	// A key found taken is the call recorded by an earlier send whose outcome its sender never
	// learnt: the run was live then and is still (its settlement deletes the keys).
	sc.add("SELECT @tg_run_live = 1")
	if err := conn.QueryRowxContext(ctx, string(sc.q), sc.args...).Scan(&live); err != nil {
		return false, endedByServer(err)
	}
	committed = true
	return live, nil
}

// Recorded is what a live named run's row has recorded of its calls (RecordRunCall); found is
// false when it records none. A call that used nothing is recorded too (found, at 0): it is
// what settles a run whose calls all failed at 0 rather than at its hold once a Redis restart
// has lost the run's zero tally.
//
// A record that cannot be one (RecordBelievable: a negative figure, which only a hand edit or
// a restored backup writes) is none: settled from, its negative cost panicked the store.
func (r Run) Recorded() (u pricing.Usage, costMicro, calls int64, found bool) {
	u = r.Usage()
	found = (r.EndedCalls > 0 || r.Calls > 0 || r.CostMicro > 0) && r.RecordBelievable()
	return u, r.CostMicro, int64(r.Calls), found
}

// RecordsMore reports whether a live named run's row records more of its calls (Recorded:
// costMicro, calls) than its Redis tally (tallyCost, tallyCalls), so that a settlement takes
// the row's figures: it costs more, or as much with more calls. A free model's calls cost 0,
// so a tally a Redis restart shrank (the calls since) costs what the row does, and settled
// from it on the tie the run lost the tokens and calls of before the restart.
func RecordsMore(costMicro, calls, tallyCost, tallyCalls int64) bool {
	return costMicro > tallyCost || (costMicro == tallyCost && calls > tallyCalls)
}

// RecordBelievable reports whether the row's record of its calls can be a record of what they
// used, by the tally's check (TallyBelievable).
func (r Run) RecordBelievable() bool {
	return TallyBelievable(r.Usage(), r.CostMicro, int64(r.Calls))
}

// Usage is the tokens the row records, with their one-hour cache write and audio parts.
func (r Run) Usage() pricing.Usage {
	return pricing.Usage{Input: r.InTok, CacheRead: r.CacheReadTok, CacheWrite: r.CacheWriteTok, Output: r.OutTok,
		CacheWrite1h: r.CacheWrite1hTok, AudioInput: r.AudioInTok, AudioOutput: r.AudioOutTok}
}

// expiredCursor is where a scan of expired holds goes on from: the expiry and run id of the
// last hold it read. The zero value starts at the oldest.
type expiredCursor struct {
	ExpiresAt time.Time
	RunID     string
}

// cursor is the cursor past r.
func (r Run) cursor() expiredCursor { return expiredCursor{ExpiresAt: r.ExpiresAt, RunID: r.RunID} }

// expired lists live holds past their expiry, oldest first (run id breaks ties), after the
// cursor, on the (state, expires_at) index (whose entries carry the primary key). A scan that
// goes on from its last row passes holds it could not settle instead of reading them again.
//
// Each state is read apart, in the index's order up to limit, and the two parts are merged by
// the database: with both states in one IN list the index gave two ranges, which were merged by
// sorting every expired hold after the cursor — each batch of a pass sorted the whole backlog
// left, so a pass over a backlog of n holds sorted n²/limit rows (0.5 s for 20 000 holds,
// minutes for the backlog a fleet's outage leaves). The database's order, not Go's, keeps the
// cursor's tie-break on run_id in its collation.
func (s *Store) expired(ctx context.Context, after expiredCursor, limit int) ([]Run, error) {
	if limit <= 0 || limit > maxListRows {
		panic(fmt.Sprintf("holds: expired batch %d out of range", limit))
	}
	q, args := expiredQuery(after, limit)
	var out []Run
	if err := s.db.SelectContext(ctx, &out, q, args...); err != nil {
		return nil, fmt.Errorf("list expired holds: %w", err)
	}
	return out, nil
}

// expiredQuery is expired's statement and its arguments.
func expiredQuery(after expiredCursor, limit int) (string, []any) {
	part := "SELECT " + runColumns + ", admit_token FROM run_holds WHERE state = ? AND expires_at < NOW(6)"
	var cursorArgs []any
	if after.RunID != "" {
		// The plain bound keeps the index range tight; the OR breaks ties in expiry.
		part += " AND expires_at >= ? AND (expires_at > ? OR run_id > ?)"
		cursorArgs = []any{after.ExpiresAt, after.ExpiresAt, after.RunID}
	}
	part += " ORDER BY expires_at, run_id LIMIT ?"
	q := "(" + part + ") UNION ALL (" + part + ") ORDER BY expires_at, run_id LIMIT ?"
	var args []any
	for _, state := range []State{StateQueued, StateRunning} {
		args = append(append(append(args, state), cursorArgs...), limit)
	}
	return q, append(args, limit)
}
