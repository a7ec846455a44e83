package holds

import (
	"context"
	"database/sql"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/pricing"
)

// Where a settlement came from, recorded in run_holds.settle_source.
const (
	SourceComplete        = "complete"         // the call ended and reported (or we estimated) its usage
	SourceCancel          = "cancel"           // the client went away mid-call
	SourceUpstreamError   = "upstream_error"   // the upstream failed before producing anything
	SourceClient          = "client"           // POST /v1/runs/{id}/settle
	SourceDuplicate       = "duplicate"        // a request found to be a duplicate released its hold
	SourceReconcile       = "reconcile"        // the reconciler, from the Redis tally
	SourceReconcileHold   = "reconcile_hold"   // the reconciler, no tally: charged what was held
	SourceRelease         = "release"          // released at 0: refused before forwarding, or queued and never forwarded (reconciler)
	SourceShutdown        = "shutdown"         // cut at the graceful-shutdown deadline
	SourceStreamError     = "stream_error"     // the upstream broke or sent an error after producing output
	SourceAdmitLost       = "admit_lost"       // an admission whose commit went unanswered, released at 0
	SourceUpstreamTimeout = "upstream_timeout" // the upstream took the request, then timed out: charged like a cancel
)

// SettleSources are every settle source above.
var SettleSources = []string{SourceComplete, SourceCancel, SourceUpstreamError, SourceClient, SourceDuplicate, SourceReconcile,
	SourceReconcileHold, SourceRelease, SourceShutdown, SourceStreamError, SourceAdmitLost, SourceUpstreamTimeout}

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
	// SnapshotIfMissing makes PriceSnapshot a fallback: a hold that recorded its prices when
	// it was admitted (AdmitRequest.PriceSnapshot) keeps them. For a settler that did not
	// compute the run's cost itself (the reconciler, a named run's settle on another process),
	// whose price table may be newer than the one the cost was computed at.
	SnapshotIfMissing bool
	// ChargeHeld charges held_micro instead of CostMicro: what the caller authorised at
	// admission, for a crashed call whose usage is lost.
	ChargeHeld bool
	// AdmitToken, when set, restricts the settlement to the hold the admission with that token
	// took (AdmitRequest.Token): a caller that never learnt its admission's outcome releases
	// its own hold, never one another request took on the same run. Otherwise ErrRunNotFound.
	AdmitToken string
	// OnlyIfExpired settles only a hold whose expiry, read under its row lock, has passed
	// (else ErrRunStillLive). The reconciler's: a later call of a named run pushes the run's
	// expiry out when it is admitted, and must not find its run settled under it by a scan
	// that read the run before.
	OnlyIfExpired bool
	// token marks the row this settlement settles (see WriteBatch): the Writer sets it, so
	// that a settlement it tries again in a second batch after the first's COMMIT reply was
	// lost still knows its own settlement. Empty: WriteBatch draws one, kept across its
	// attempts.
	token string
}

// Settled is what a settlement did.
type Settled struct {
	Applied       bool // false: the run had been settled before; nothing changed
	ChargedMicro  int64
	AllowancePart int64
	PrepaidPart   int64
	CostMicro     int64
	// UnchargedMicro is the cost, less the discount, that the hold's cap clamped away: what the
	// provider charged that no one was charged for (a call answered by a dearer model than its
	// output bound was reckoned at, a prompt estimated under a long-context line and reported
	// past it). 0 for a run charged its hold.
	UnchargedMicro int64
	UserID         uint64
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
		return nil, fmt.Errorf("find holds: %w", err)
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
	RunID      string
	UserID     uint64
	State      State
	HeldMicro  int64
	CapMicro   int64
	DiscountBP int
	// ExpiresAt is written back only in the settlement's INSERT, whose update branch leaves it
	// as it is; a zero date (a hand edit without strict mode) is read as the least date the
	// strict session takes, or the settlement failed at every pass.
	ExpiresAt string
	// Counted: live and unexpired at the batch's clock, so the admission aggregate counted it
	// in flight (its held it counts while it is unsettled, expired or not).
	Counted bool
	Token   sql.NullString // the admission's token, if it had one
	// HasSnapshot: the hold recorded the prices it was admitted at (see SnapshotIfMissing).
	HasSnapshot bool
	// Named: a caller-named run's hold (X-Run-Id), counted among the open runs when Counted.
	Named bool
	// SettleToken is the token of the settlement that settled it (see WriteBatch), and
	// Settled what that settlement did: a retry whose earlier attempt's COMMIT reply was
	// lost finds its own settlement there.
	SettleToken sql.NullString
	Settled     Settled
}

// settleWrites is what a batch's settlements change.
type settleWrites struct {
	changed  []settledRow
	dayOrder []uint64 // users whose ledger grows, in batch order
	dayAdd   map[uint64]*dayDelta
}

// decideSettlements closes a batch's runs against what the locked reads found. A hold is
// charged only if the locked read found it live (queued or running) — the conditional update
// of the design, decided under the hold's row lock — so every later settlement of it, by a
// retry, the reconciler or a slow process, changes nothing. A charge is the discounted cost
// clamped to the hold's cap (the caller's authorisation and the overdraft bound), taken from
// the day's allowance first and then from prepaid credits. The batch's reads are brought up to
// date as it goes, so that its admissions see the credits freed and the ledger grown.
func (s *Store) decideSettlements(sts []Settlement, tokens []string, users []uint64, r *batchReads) ([]BatchResult, settleWrites) {
	out := make([]BatchResult, len(sts))
	w := settleWrites{dayAdd: map[uint64]*dayDelta{}}
	for i, st := range sts {
		h, ok := r.holds[st.RunID]
		u, userOK := r.users[users[i]]
		if !ok || h.UserID != users[i] || (st.AdmitToken != "" && h.Token.String != st.AdmitToken) {
			out[i].Err = ErrRunNotFound
			continue
		}
		if !userOK {
			out[i].Err = errUserGone
			continue
		}
		out[i].UserID = h.UserID
		if h.State == StateSettled {
			// Settled before, or earlier in this batch: by this settlement itself only if an
			// earlier attempt of this batch committed it and lost the reply.
			if h.SettleToken.Valid && h.SettleToken.String == tokens[i] {
				out[i].Settled = h.Settled
				out[i].Applied = true
				// The row keeps no uncharged figure, but its cost and charge give it: this
				// settlement clamped it away, and the metric and the money log count it once,
				// here. (A run charged its hold costs its hold, which no discount raises.)
				out[i].UnchargedMicro = max(0, pricing.ApplyDiscount(h.Settled.CostMicro, h.DiscountBP)-h.Settled.ChargedMicro)
			}
			continue
		}
		if st.OnlyIfExpired && h.Counted {
			out[i].Err = ErrRunStillLive
			continue
		}
		h.State = StateSettled
		live := r.live[h.UserID]
		if live.Aggregated {
			// The aggregate held every unsettled hold, in flight only the unexpired ones.
			live.Held -= owedMicro(h.HeldMicro, h.CapMicro, h.Settled.CostMicro, h.DiscountBP)
			if h.Counted {
				live.InFlight--
				if h.Named {
					live.OpenRuns--
				}
			}
		}
		if e, ok := r.existing[h.RunID]; ok {
			e.State = StateSettled
			r.existing[h.RunID] = e
		}
		cost := st.CostMicro
		due := pricing.ApplyDiscount(cost, h.DiscountBP)
		charged := min(due, h.CapMicro)
		if st.ChargeHeld {
			cost, due, charged = h.HeldMicro, h.HeldMicro, h.HeldMicro
		}
		allowancePart := min(charged, max(0, s.plan(u).AllowanceMicro-live.UsedToday))
		prepaidPart := charged - allowancePart
		live.UsedToday += charged
		if prepaidPart > 0 {
			u.PrepaidMicro -= prepaidPart
			r.users[h.UserID] = u
		}
		out[i].Settled = Settled{Applied: true, ChargedMicro: charged, AllowancePart: allowancePart, PrepaidPart: prepaidPart,
			CostMicro: cost, UnchargedMicro: due - charged, UserID: h.UserID}
		w.changed = append(w.changed, settledRow{hold: h, st: st, token: tokens[i], cost: cost, charged: charged,
			allowance: allowancePart, prepaid: prepaidPart})
		// A run that cost nothing leaves the ledger alone: it is a release, not a charge.
		if charged > 0 {
			d := w.dayAdd[h.UserID]
			if d == nil {
				d = &dayDelta{}
				w.dayAdd[h.UserID] = d
				w.dayOrder = append(w.dayOrder, h.UserID)
			}
			d.used += charged
			d.runs++
			d.prepaid += prepaidPart
		}
	}
	return out, w
}

type settledRow struct {
	hold                              *lockedHold
	st                                Settlement
	token                             string
	cost, charged, allowance, prepaid int64
}

type dayDelta struct{ used, runs, prepaid int64 }

// appendSettled adds a batch's settlement writes to its closing script: the holds, the day
// ledger (the ledger's day is the UTC day of now, the batch's one clock reading, so a batch
// that straddles midnight lands wholly on one day), and what was taken from prepaid credits.
func appendSettled(sc *script, w settleWrites, now time.Time) {
	if len(w.changed) == 0 {
		return
	}
	appendMarkSettled(sc, w.changed, now)
	appendForgetRunCalls(sc, w.changed)
	appendAddToDays(sc, now.Format(time.DateOnly), w.dayOrder, w.dayAdd)
	for _, uid := range w.dayOrder {
		if p := w.dayAdd[uid].prepaid; p > 0 {
			sc.add("UPDATE users SET prepaid_micro = prepaid_micro - ? WHERE id = ?", p, uid)
		}
	}
}

// appendForgetRunCalls deletes the keys of the calls the settled named runs recorded
// (RecordRunCall), which only a record of a live run reads: the run's row is locked, so none
// is added after. A plain call's run records none, and its settlement, the hot path, sends no
// statement for them (but for an Idempotency-Key attempt whose answer Redis refused to store:
// its one key is left to `gateway prune`).
func appendForgetRunCalls(sc *script, rows []settledRow) {
	var named []string
	for _, r := range rows {
		if r.hold.Named {
			named = append(named, r.hold.RunID)
		}
	}
	if len(named) > 0 {
		sc.addIn("DELETE FROM run_calls WHERE run_id IN (?)", named)
	}
}

// appendMarkSettled writes the settled holds in one statement. Every row exists and is
// locked by this transaction (and was read live under that lock: the design's conditional
// update), so INSERT … ON DUPLICATE KEY UPDATE only ever takes its update branch: a multi-row
// UPDATE with per-row values. The NOT NULL columns an insert would need carry the rows'
// current values. A row already marked estimated keeps the mark: a named run's calls charged
// an estimate set it as they ended (RecordRunCall), and neither its tally nor its row's figures
// carry it to the settlement.
func appendMarkSettled(sc *script, rows []settledRow, now time.Time) {
	const perRow = 24
	q := make([]byte, 0, 1024+len(rows)*72)
	q = append(q, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, discount_bp, expires_at,
		cost_micro, charged_micro, allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok,
		out_tok, cache_write_1h_tok, audio_in_tok, audio_out_tok, calls, model, price_snapshot, estimated, settle_source,
		settled_at, settle_token) VALUES `...)
	args := make([]any, 0, len(rows)*perRow)
	for i, r := range rows {
		if i > 0 {
			q = append(q, ',')
		}
		q = append(q, "(?,?,'settled',?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"...)
		u := r.st.Usage.Clamp()
		snapshot := r.st.PriceSnapshot
		if r.st.SnapshotIfMissing && r.hold.HasSnapshot {
			snapshot = nil // the row's own is kept (COALESCE below)
		}
		model := r.st.Model
		if !utf8.ValidString(model) {
			// The model is a label, the hold already has the one it was admitted with (''
			// keeps it, below); bytes the utf8mb4 column refuses would fail the whole batch.
			model = ""
		}
		args = append(args, r.hold.RunID, r.hold.UserID, r.hold.HeldMicro, r.hold.CapMicro, r.hold.DiscountBP, r.hold.ExpiresAt,
			r.cost, r.charged, r.allowance, r.prepaid, u.Input, u.CacheRead, u.CacheWrite, u.Output,
			u.CacheWrite1h, u.AudioInput, u.AudioOutput, r.st.Calls,
			model, nullJSON(snapshot), r.st.Estimated, r.st.Source, now, r.token)
	}
	q = append(q, ` ON DUPLICATE KEY UPDATE state = VALUES(state), cost_micro = VALUES(cost_micro),
		charged_micro = VALUES(charged_micro), allowance_part_micro = VALUES(allowance_part_micro),
		prepaid_part_micro = VALUES(prepaid_part_micro), in_tok = VALUES(in_tok), cache_read_tok = VALUES(cache_read_tok),
		cache_write_tok = VALUES(cache_write_tok), out_tok = VALUES(out_tok), cache_write_1h_tok = VALUES(cache_write_1h_tok),
		audio_in_tok = VALUES(audio_in_tok), audio_out_tok = VALUES(audio_out_tok), calls = VALUES(calls),
		model = IF(VALUES(model) = '', model, VALUES(model)), price_snapshot = COALESCE(VALUES(price_snapshot), price_snapshot),
		estimated = GREATEST(estimated, VALUES(estimated)), settle_source = VALUES(settle_source), settled_at = VALUES(settled_at),
		settle_token = VALUES(settle_token)`...)
	sc.add(string(q), args...)
}

// appendAddToDays adds the batch's charges to the day's ledger rows in one upsert. The users'
// rows are locked, so no other transaction writes these ledger rows meanwhile.
func appendAddToDays(sc *script, day string, order []uint64, add map[uint64]*dayDelta) {
	if len(order) == 0 {
		return
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
	sc.add(string(q), args...)
}

func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}
