package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/pricing"
)

// Where a settlement came from, recorded in run_holds.settle_source.
const (
	SourceComplete      = "complete"       // the call ended and reported (or we estimated) its usage
	SourceCancel        = "cancel"         // the client went away mid-call
	SourceUpstreamError = "upstream_error" // the upstream failed before producing anything
	SourceClient        = "client"         // POST /v1/runs/{id}/settle
	SourceDuplicate     = "duplicate"      // a request found to be a duplicate released its hold
	SourceReconcile     = "reconcile"      // the reconciler, from the Redis tally
	SourceReconcileHold = "reconcile_hold" // the reconciler, no tally: charged what was held
	SourceRelease       = "release"        // the reconciler released a queued hold at 0
	SourceShutdown      = "shutdown"       // cut at the graceful-shutdown deadline
	SourceStreamError   = "stream_error"   // the upstream broke or sent an error after producing output
)

// Settlement is the final usage of a run.
type Settlement struct {
	RunID string
	// UserID, when the caller knows it (the proxy does), saves a lookup before the
	// transaction; it must be the hold's user.
	UserID    uint64
	Usage     pricing.Usage
	CostMicro int64 // at list price, before discount
	Calls     int
	Model     string
	Source    string
	Estimated bool
	// PriceSnapshot is the JSON of the prices used, kept so the bill can be explained later.
	PriceSnapshot []byte
	// ChargeHeld charges held_micro instead of CostMicro: what the caller authorised at
	// admission, for a crashed call whose usage is lost.
	ChargeHeld bool
}

// Settled is what a settlement did.
type Settled struct {
	Applied         bool // false: the run had been settled before; nothing changed
	ChargedMicro    int64
	AllowancePart   int64
	PrepaidPart     int64
	CostMicro       int64
	UserID          uint64
	DayUsedMicroNow int64
}

// Settle closes a run in one transaction, in the global lock order: the user's row, the hold
// (a conditional update that only a live hold passes), then the day ledger. Only the
// settlement that moved the hold out of queued/running charges; every later one — a retry,
// the reconciler, a slow process — changes nothing. The charge is the discounted cost,
// clamped to the hold's cap (the caller's authorisation and the overdraft bound), taken from
// the day's allowance first and then from prepaid credits.
func (s *Store) Settle(ctx context.Context, st Settlement) (Settled, error) {
	if st.CostMicro < 0 {
		panic("holds: negative cost")
	}
	// user_id never changes, so it is read before the transaction: the transaction's first
	// statement must be the user lock, or its snapshot would predate that lock.
	userID := st.UserID
	if userID == 0 {
		err := s.withRetry(ctx, "settle "+st.RunID, func() error {
			return s.db.GetContext(ctx, &userID, "SELECT user_id FROM run_holds WHERE run_id = ?", st.RunID)
		})
		if errors.Is(err, sql.ErrNoRows) {
			return Settled{}, fmt.Errorf("settle %s: %w", st.RunID, ErrRunNotFound)
		}
		if err != nil {
			return Settled{}, fmt.Errorf("settle %s: find hold: %w", st.RunID, err)
		}
	}
	var out Settled
	err := s.inTx(ctx, "settle "+st.RunID, func(tx *sqlx.Tx) error {
		var err error
		out, err = s.settleTx(ctx, tx, userID, st)
		return err
	})
	if err != nil {
		return Settled{}, fmt.Errorf("settle %s: %w", st.RunID, err)
	}
	return out, nil
}

func (s *Store) settleTx(ctx context.Context, tx *sqlx.Tx, userID uint64, st Settlement) (Settled, error) {
	u, err := lockUser(ctx, tx, userID)
	if err != nil {
		return Settled{}, err
	}
	// The hold, the database clock and today's ledger in one round trip. Its consistent reads
	// start after the user lock was granted (the previous statement), and every writer of this
	// user's ledger holds that lock, so used_today is current. One reading of the clock gives
	// both settled_at and the ledger's day, so a settlement that straddles midnight UTC lands
	// wholly on one day. Sessions run in UTC.
	var h struct {
		UserID     uint64    `db:"user_id"`
		State      State     `db:"state"`
		HeldMicro  int64     `db:"held_micro"`
		CapMicro   int64     `db:"cap_micro"`
		DiscountBP int       `db:"discount_bp"`
		Now        time.Time `db:"now"`
		Day        string    `db:"day"`
		UsedToday  int64     `db:"used_today"`
	}
	err = tx.GetContext(ctx, &h, `SELECT h.user_id, h.state, h.held_micro, h.cap_micro, h.discount_bp, t.now,
		DATE_FORMAT(t.now, '%Y-%m-%d') AS day,
		COALESCE((SELECT used_micro FROM usage_days WHERE user_id = h.user_id AND day = DATE(t.now)), 0) AS used_today
		FROM run_holds h, (SELECT NOW(6) AS now) t WHERE h.run_id = ? FOR UPDATE`, st.RunID)
	if errors.Is(err, sql.ErrNoRows) {
		return Settled{}, ErrRunNotFound
	}
	if err != nil {
		return Settled{}, fmt.Errorf("read hold: %w", err)
	}
	if h.UserID != userID {
		return Settled{}, fmt.Errorf("hold belongs to user %d, not %d: %w", h.UserID, userID, ErrRunNotFound)
	}
	if h.State == StateSettled {
		return Settled{UserID: userID}, nil
	}

	cost := st.CostMicro
	charged := min(pricing.ApplyDiscount(cost, h.DiscountBP), h.CapMicro)
	if st.ChargeHeld {
		cost, charged = h.HeldMicro, h.HeldMicro
	}
	usedToday := h.UsedToday
	allowancePart := min(charged, max(0, s.plan(u).AllowanceMicro-usedToday))
	prepaidPart := charged - allowancePart

	u2 := st.Usage.Clamp()
	res, err := tx.ExecContext(ctx, `
		UPDATE run_holds
		SET state = 'settled', cost_micro = ?, charged_micro = ?, allowance_part_micro = ?, prepaid_part_micro = ?,
		    in_tok = ?, cache_read_tok = ?, cache_write_tok = ?, out_tok = ?, calls = ?,
		    model = IF(? = '', model, ?), price_snapshot = ?, estimated = ?, settle_source = ?, settled_at = ?
		WHERE run_id = ? AND state IN ('queued', 'running')`,
		cost, charged, allowancePart, prepaidPart, u2.Input, u2.CacheRead, u2.CacheWrite, u2.Output, st.Calls,
		st.Model, st.Model, nullJSON(st.PriceSnapshot), st.Estimated, st.Source, h.Now, st.RunID)
	if err != nil {
		return Settled{}, fmt.Errorf("mark settled: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return Settled{}, fmt.Errorf("mark settled: %w", err)
	} else if n != 1 {
		// The hold row is locked by this transaction and was live: anything but one row is a bug.
		return Settled{}, fmt.Errorf("mark settled: %d rows changed, want 1", n)
	}
	out := Settled{Applied: true, ChargedMicro: charged, AllowancePart: allowancePart, PrepaidPart: prepaidPart,
		CostMicro: cost, UserID: userID, DayUsedMicroNow: usedToday}
	// A run that cost nothing leaves the ledger alone: it is a release, not a charge.
	if charged == 0 {
		return out, nil
	}
	if err := addToDay(ctx, tx, userID, h.Day, charged); err != nil {
		return Settled{}, err
	}
	out.DayUsedMicroNow += charged
	if prepaidPart > 0 {
		if _, err := tx.ExecContext(ctx, "UPDATE users SET prepaid_micro = prepaid_micro - ? WHERE id = ?", prepaidPart, userID); err != nil {
			return Settled{}, fmt.Errorf("take from prepaid: %w", err)
		}
	}
	return out, nil
}

// addToDay adds a charge to today's ledger row: an UPDATE in the database (never read-add-
// write), an INSERT inside a savepoint when the row does not exist yet, and on a duplicate key
// (another transaction inserted it first) a rollback to the savepoint and the UPDATE again.
func addToDay(ctx context.Context, tx *sqlx.Tx, userID uint64, day string, charged int64) error {
	const update = "UPDATE usage_days SET used_micro = used_micro + ?, run_count = run_count + 1 WHERE user_id = ? AND day = ?"
	res, err := tx.ExecContext(ctx, update, charged, userID, day)
	if err != nil {
		return fmt.Errorf("add to day ledger: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, "SAVEPOINT day_insert"); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO usage_days (user_id, day, used_micro, run_count) VALUES (?, ?, ?, 1)", userID, day, charged)
	if err == nil {
		return nil
	}
	if !isDuplicate(err) {
		return fmt.Errorf("insert day ledger: %w", err)
	}
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT day_insert"); err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	res, err = tx.ExecContext(ctx, update, charged, userID, day)
	if err != nil {
		return fmt.Errorf("add to day ledger after insert race: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("add to day ledger after insert race: %d rows changed, want 1", n)
	}
	return nil
}

// holdRow is a run_holds row.
type holdRow struct {
	RunID       string         `db:"run_id"`
	UserID      uint64         `db:"user_id"`
	ClientRunID sql.NullString `db:"client_run_id"`
	State       State          `db:"state"`
	HeldMicro   int64          `db:"held_micro"`
	CapMicro    int64          `db:"cap_micro"`
	DiscountBP  int            `db:"discount_bp"`
}

func getHold(ctx context.Context, tx *sqlx.Tx, runID string, forUpdate bool) (holdRow, error) {
	q := "SELECT run_id, user_id, client_run_id, state, held_micro, cap_micro, discount_bp FROM run_holds WHERE run_id = ?"
	if forUpdate {
		q += " FOR UPDATE"
	}
	var h holdRow
	err := tx.GetContext(ctx, &h, q, runID)
	if errors.Is(err, sql.ErrNoRows) {
		return h, ErrRunNotFound
	}
	if err != nil {
		return h, fmt.Errorf("read hold: %w", err)
	}
	return h, nil
}

func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}
