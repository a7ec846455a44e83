package holds

import (
	"context"
	"database/sql"
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
	Applied       bool // false: the run had been settled before; nothing changed
	ChargedMicro  int64
	AllowancePart int64
	PrepaidPart   int64
	CostMicro     int64
	UserID        uint64
}

// Settle closes one run: SettleBatch of one.
func (s *Store) Settle(ctx context.Context, st Settlement) (Settled, error) {
	out, err := s.SettleBatch(ctx, []Settlement{st})
	if err != nil {
		return Settled{}, err
	}
	if out[0].Err != nil {
		return Settled{}, fmt.Errorf("settle %s: %w", st.RunID, out[0].Err)
	}
	return out[0].Settled, nil
}

// BatchResult is one settlement's outcome within a batch.
type BatchResult struct {
	Settled
	Err error // ErrRunNotFound for an unknown run (or one of another user); the rest of the batch still commits
}

// SettleBatch closes runs in one transaction: WriteBatch without admissions.
func (s *Store) SettleBatch(ctx context.Context, sts []Settlement) ([]BatchResult, error) {
	out, _, err := s.WriteBatch(ctx, sts, nil)
	return out, err
}

// usersOf returns each settlement's user: the caller's word where it gave one, otherwise
// read before the transaction (user_id never changes), so that the transaction's first
// statement is the user lock.
func (s *Store) usersOf(ctx context.Context, sts []Settlement) ([]uint64, error) {
	users := make([]uint64, len(sts))
	var unknown []string
	for i, st := range sts {
		users[i] = st.UserID
		if st.UserID == 0 {
			unknown = append(unknown, st.RunID)
		}
	}
	if len(unknown) == 0 {
		return users, nil
	}
	q, args, err := sqlx.In("SELECT run_id, user_id FROM run_holds WHERE run_id IN (?)", unknown)
	if err != nil {
		return nil, err
	}
	var rows []struct {
		RunID  string `db:"run_id"`
		UserID uint64 `db:"user_id"`
	}
	if err := s.withRetry(ctx, "find holds", func() error { return s.db.SelectContext(ctx, &rows, q, args...) }); err != nil {
		return nil, fmt.Errorf("find holds: %w", err)
	}
	byRun := make(map[string]uint64, len(rows))
	for _, r := range rows {
		byRun[r.RunID] = r.UserID
	}
	for i, st := range sts {
		if users[i] == 0 {
			users[i] = byRun[st.RunID] // 0 when unknown: reported as ErrRunNotFound
		}
	}
	return users, nil
}

// lockedHold is a hold as the settlement transaction reads it, under its row lock.
type lockedHold struct {
	RunID      string `db:"run_id"`
	UserID     uint64 `db:"user_id"`
	State      State  `db:"state"`
	HeldMicro  int64  `db:"held_micro"`
	CapMicro   int64  `db:"cap_micro"`
	DiscountBP int    `db:"discount_bp"`
	ExpiresAt  string `db:"expires_at"`
}

// settleLocked closes a batch's runs under the users' locks. A hold is charged only if the
// locked read finds it live (queued or running) — the conditional update of the design, decided
// under the hold's row lock — so every later settlement of it, by a retry, the reconciler or a
// slow process, changes nothing. A charge is the discounted cost clamped to the hold's cap (the
// caller's authorisation and the overdraft bound), taken from the day's allowance first and then
// from prepaid credits. now is the one reading of the database clock of the transaction: it gives
// both settled_at and the ledger's day, so a batch that straddles midnight UTC lands wholly on
// one day (sessions run in UTC).
func (s *Store) settleLocked(ctx context.Context, tx *sqlx.Tx, sts []Settlement, users []uint64, byUser map[uint64]userRow, now time.Time) ([]BatchResult, error) {
	out := make([]BatchResult, len(sts))
	var ids []uint64
	seen := make(map[uint64]bool, len(sts))
	for i, uid := range users {
		if _, ok := byUser[uid]; !ok {
			out[i].Err = ErrRunNotFound
			continue
		}
		if !seen[uid] {
			seen[uid] = true
			ids = append(ids, uid)
		}
	}
	if len(ids) == 0 {
		return out, nil
	}
	day := now.Format(time.DateOnly)

	// The holds, under their row locks. Their reads start after the user locks were
	// granted, and every writer of a hold's state holds its user's lock, so states are current.
	runIDs := make([]string, 0, len(sts))
	for i, st := range sts {
		if out[i].Err == nil {
			runIDs = append(runIDs, st.RunID)
		}
	}
	q, args, err := sqlx.In(`SELECT run_id, user_id, state, held_micro, cap_micro, discount_bp,
		DATE_FORMAT(expires_at, '%Y-%m-%d %H:%i:%s.%f') AS expires_at
		FROM run_holds WHERE run_id IN (?) FOR UPDATE`, runIDs)
	if err != nil {
		return nil, err
	}
	var hs []lockedHold
	if err := tx.SelectContext(ctx, &hs, q, args...); err != nil {
		return nil, fmt.Errorf("lock holds: %w", err)
	}
	holds := make(map[string]*lockedHold, len(hs))
	for i := range hs {
		holds[hs[i].RunID] = &hs[i]
	}

	// Today's ledger of those users: every writer of it holds the user's lock.
	q, args, err = sqlx.In("SELECT user_id, used_micro FROM usage_days WHERE day = ? AND user_id IN (?)", day, ids)
	if err != nil {
		return nil, err
	}
	var ledger []struct {
		UserID uint64 `db:"user_id"`
		Used   int64  `db:"used_micro"`
	}
	if err := tx.SelectContext(ctx, &ledger, q, args...); err != nil {
		return nil, fmt.Errorf("read day ledger: %w", err)
	}
	used := make(map[uint64]int64, len(ids))
	for _, l := range ledger {
		used[l.UserID] = l.Used
	}

	// Decide each settlement in batch order; a user's charges consume the allowance in turn.
	var changed []settledRow
	dayAdd := map[uint64]*dayDelta{}
	var dayOrder []uint64
	for i, st := range sts {
		h, ok := holds[st.RunID]
		u, userOK := byUser[users[i]]
		if !ok || !userOK || h.UserID != users[i] {
			out[i].Err = ErrRunNotFound
			continue
		}
		out[i].UserID = h.UserID
		if h.State == StateSettled {
			continue // settled before, or earlier in this batch
		}
		h.State = StateSettled
		cost := st.CostMicro
		charged := min(pricing.ApplyDiscount(cost, h.DiscountBP), h.CapMicro)
		if st.ChargeHeld {
			cost, charged = h.HeldMicro, h.HeldMicro
		}
		allowancePart := min(charged, max(0, s.plan(u).AllowanceMicro-used[h.UserID]))
		prepaidPart := charged - allowancePart
		used[h.UserID] += charged
		out[i].Settled = Settled{Applied: true, ChargedMicro: charged, AllowancePart: allowancePart, PrepaidPart: prepaidPart,
			CostMicro: cost, UserID: h.UserID}
		changed = append(changed, settledRow{hold: h, st: st, cost: cost, charged: charged, allowance: allowancePart, prepaid: prepaidPart})
		// A run that cost nothing leaves the ledger alone: it is a release, not a charge.
		if charged > 0 {
			d := dayAdd[h.UserID]
			if d == nil {
				d = &dayDelta{}
				dayAdd[h.UserID] = d
				dayOrder = append(dayOrder, h.UserID)
			}
			d.used += charged
			d.runs++
			d.prepaid += prepaidPart
		}
	}
	if len(changed) == 0 {
		return out, nil
	}
	if err := markSettled(ctx, tx, changed, now); err != nil {
		return nil, err
	}
	if err := addToDays(ctx, tx, day, dayOrder, dayAdd); err != nil {
		return nil, err
	}
	for _, uid := range dayOrder {
		if p := dayAdd[uid].prepaid; p > 0 {
			if _, err := tx.ExecContext(ctx, "UPDATE users SET prepaid_micro = prepaid_micro - ? WHERE id = ?", p, uid); err != nil {
				return nil, fmt.Errorf("take from prepaid: %w", err)
			}
		}
	}
	return out, nil
}

type settledRow struct {
	hold                              *lockedHold
	st                                Settlement
	cost, charged, allowance, prepaid int64
}

type dayDelta struct{ used, runs, prepaid int64 }

// markSettled writes the settled holds in one statement. Every row exists and is locked by
// this transaction (and was read live under that lock: the design's conditional update), so
// INSERT … ON DUPLICATE KEY UPDATE only ever takes its update branch: a multi-row UPDATE with
// per-row values. The NOT NULL columns an insert would need carry the rows' current values.
func markSettled(ctx context.Context, tx *sqlx.Tx, rows []settledRow, now time.Time) error {
	const perRow = 20
	q := make([]byte, 0, 1024+len(rows)*64)
	q = append(q, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, discount_bp, expires_at,
		cost_micro, charged_micro, allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok,
		out_tok, calls, model, price_snapshot, estimated, settle_source, settled_at) VALUES `...)
	args := make([]any, 0, len(rows)*perRow)
	for i, r := range rows {
		if i > 0 {
			q = append(q, ',')
		}
		q = append(q, "(?,?,'settled',?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"...)
		u := r.st.Usage.Clamp()
		args = append(args, r.hold.RunID, r.hold.UserID, r.hold.HeldMicro, r.hold.CapMicro, r.hold.DiscountBP, r.hold.ExpiresAt,
			r.cost, r.charged, r.allowance, r.prepaid, u.Input, u.CacheRead, u.CacheWrite, u.Output, r.st.Calls,
			r.st.Model, nullJSON(r.st.PriceSnapshot), r.st.Estimated, r.st.Source, now)
	}
	q = append(q, ` ON DUPLICATE KEY UPDATE state = VALUES(state), cost_micro = VALUES(cost_micro),
		charged_micro = VALUES(charged_micro), allowance_part_micro = VALUES(allowance_part_micro),
		prepaid_part_micro = VALUES(prepaid_part_micro), in_tok = VALUES(in_tok), cache_read_tok = VALUES(cache_read_tok),
		cache_write_tok = VALUES(cache_write_tok), out_tok = VALUES(out_tok), calls = VALUES(calls),
		model = IF(VALUES(model) = '', model, VALUES(model)), price_snapshot = COALESCE(VALUES(price_snapshot), price_snapshot),
		estimated = VALUES(estimated), settle_source = VALUES(settle_source), settled_at = VALUES(settled_at)`...)
	if _, err := tx.ExecContext(ctx, string(q), args...); err != nil {
		return fmt.Errorf("mark %d holds settled: %w", len(rows), err)
	}
	return nil
}

// addToDays adds the batch's charges to today's ledger rows in one upsert. The users' rows
// are locked, so no other transaction writes these ledger rows meanwhile.
func addToDays(ctx context.Context, tx *sqlx.Tx, day string, order []uint64, add map[uint64]*dayDelta) error {
	if len(order) == 0 {
		return nil
	}
	q := make([]byte, 0, 160+len(order)*16)
	q = append(q, "INSERT INTO usage_days (user_id, day, used_micro, run_count) VALUES "...)
	args := make([]any, 0, len(order)*4)
	for i, uid := range order {
		if i > 0 {
			q = append(q, ',')
		}
		q = append(q, "(?,?,?,?)"...)
		args = append(args, uid, day, add[uid].used, add[uid].runs)
	}
	q = append(q, " ON DUPLICATE KEY UPDATE used_micro = used_micro + VALUES(used_micro), run_count = run_count + VALUES(run_count)"...)
	if _, err := tx.ExecContext(ctx, string(q), args...); err != nil {
		return fmt.Errorf("add to day ledger: %w", err)
	}
	return nil
}

func distinctNonZero(ids []uint64) []uint64 {
	seen := make(map[uint64]bool, len(ids))
	var out []uint64
	for _, id := range ids {
		if id != 0 && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
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

func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}
