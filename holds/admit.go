package holds

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate/pricing"
)

// State is a hold's lifecycle state.
type State string

const (
	StateQueued  State = "queued"  // admitted, nothing forwarded yet (a run opened before its first call)
	StateRunning State = "running" // a call was forwarded
	StateSettled State = "settled" // final; the row stays forever so a second settlement is a no-op
)

// AdmitRequest asks for a hold.
type AdmitRequest struct {
	RunID       string
	UserID      uint64
	ClientRunID string // the caller's X-Run-Id, if any
	SessionID   string
	Model       string
	Heavy       bool // take the heavy tier whatever UserTurns says (tests and tools)
	// UserTurns is the conversation's user turns: the heavy tier applies from the plan's
	// HeavyAfterTurns, decided here with the rest of the plan read under the user lock. A
	// caller deciding it from a plan it had cached (the proxy's key cache) used the old plan's
	// threshold with the new plan's tiers for up to key_cache_ttl after a plan change.
	UserTurns int
	State     State         // queued or running
	TTL       time.Duration // hold_ttl for a one-call run, run_ttl for an X-Run-Id run
	// Fresh promises the run id was just generated at random, so it cannot exist yet: the
	// lookup of an earlier admission is skipped (the primary key still guards).
	Fresh bool
	// Token, random and kept across retries of this one request (32 hex characters), marks the
	// hold it takes. When the reply to its COMMIT is lost, the token is what tells this request's
	// own hold apart from one another request took on the same named run: a retry claims, and
	// a release (Settlement.AdmitToken) closes, only the hold carrying it. Empty: none.
	Token string
	// PriceSnapshot is the JSON of the prices the call's cost will be computed at (the
	// admitting process's table), recorded on a new hold: a run settled by another process
	// (the reconciler, a replica with a newer price table) keeps it, so its bill can be
	// explained by the prices it was billed at. Empty: none recorded.
	PriceSnapshot []byte
	// ServedBy is the id of the serving process's Instance, recorded on a new hold: when that
	// process is declared dead, the reconciler settles the hold without waiting for its
	// expiry. Empty (tools, tests): none, and the hold waits for its expiry.
	ServedBy string
}

// Hold is an admitted hold.
type Hold struct {
	RunID      string
	UserID     uint64
	State      State
	HeldMicro  int64
	CapMicro   int64
	DiscountBP int
	// Existing is set when the run had been admitted before (a retry, a redelivery, a later call
	// of an agent run): no second hold was taken.
	Existing bool
	// MaxInFlight is the user's in-flight limit as this admission read it: a named run's calls
	// share one hold, and this bounds how many of them may run at once.
	MaxInFlight int
	// RecordedMicro, for a run admitted before (or a hold claimed after its COMMIT reply was
	// lost: later calls of its run may have ended meanwhile), is what its row records its
	// ended calls cost (RecordRunCall): a durable lower bound of what the run has used, which
	// its budget in Redis counts as spent when a restart has lost the tally.
	RecordedMicro int64
}

// Admit takes a hold: AdmitBatch of one. The gateway admits through a Writer, which shares
// each transaction with other admissions and settlements; Admit is for tests and tools.
func (s *Store) Admit(ctx context.Context, req AdmitRequest) (Hold, error) {
	out, err := s.AdmitBatch(ctx, []AdmitRequest{req})
	if err != nil {
		return Hold{}, err
	}
	if out[0].Err != nil {
		return Hold{}, fmt.Errorf("admit %s: %w", req.RunID, out[0].Err)
	}
	return out[0].Hold, nil
}

// AdmitResult is one admission's outcome within a batch: a hold, or the refusal
// (TooManyInFlightError, ErrInsufficient, ErrUserDisabled, ErrUnknownUser, ErrRunSettled,
// ErrRunNotFound, ErrInvalidModel).
type AdmitResult struct {
	Hold Hold
	Err  error
}

// AdmitBatch takes holds in one short transaction: WriteBatch without settlements (tests and
// tools; the gateway's Writer calls WriteBatch).
func (s *Store) AdmitBatch(ctx context.Context, reqs []AdmitRequest) ([]AdmitResult, error) {
	_, out, err := s.WriteBatch(ctx, nil, reqs)
	return out, err
}

// liveTotals is what a user has in flight, kept current across a batch.
type liveTotals struct {
	UserID   uint64
	InFlight int
	// OpenRuns is how many of InFlight are named runs: their slots free when they are settled
	// or expire, not when a call ends.
	OpenRuns  int
	Held      int64
	UsedToday int64
	// Aggregated: the user has admissions in the batch, so its live holds were counted.
	Aggregated bool
}

// admittedRow is one admission's write: a new hold, or (existing) a run admitted before whose
// expiry moves out.
type admittedRow struct {
	hold     Hold
	req      AdmitRequest
	expires  time.Time
	existing bool
}

// decideAdmissions decides a batch's admissions in batch order against what the locked reads
// found. The user lock is what makes a burst of concurrent requests from one user see each
// other's holds: a request admitted in an earlier transaction is counted by the aggregate, one
// admitted earlier in this batch by the running totals, so the in-flight limit and the balance
// hold across both. Settlements earlier in the batch have already updated the totals.
func (s *Store) decideAdmissions(reqs []AdmitRequest, r *batchReads) ([]AdmitResult, []admittedRow) {
	out := make([]AdmitResult, len(reqs))
	var inserts []admittedRow
	for i, req := range reqs {
		if !utf8.ValidString(req.Model) {
			// Refused here, item by item: the utf8mb4 column would refuse the bytes in the
			// batch's closing script, failing every other caller's admission and settlement
			// with it. (No earlier attempt can have stored such a hold to claim.)
			out[i].Err = ErrInvalidModel
			continue
		}
		h, seen := r.existing[req.RunID]
		if seen && req.Token != "" && h.Token.Valid && h.Token.String == req.Token && h.UserID == req.UserID {
			out[i] = s.claimOwnHold(req, h, r)
			continue
		}
		u, ok := r.users[req.UserID]
		switch {
		case !ok:
			out[i].Err = ErrUnknownUser
			continue
		case u.DisabledAt.Valid:
			out[i].Err = ErrUserDisabled
			continue
		}
		plan := s.plan(u)
		var write admittedRow
		var writes bool
		if seen {
			out[i], write, writes = readmit(req, h, u, plan, r)
		} else {
			out[i], write, writes = admitNew(req, u, plan, r)
		}
		if writes {
			inserts = append(inserts, write)
		}
	}
	return out, inserts
}

// claimOwnHold answers a request whose own hold an earlier attempt committed, its reply lost.
// The hold is the caller's whatever has changed since (a user disabled meanwhile): refusing it
// would leave a hold nobody releases. A named run's later calls may have been admitted on it
// meanwhile, and ended: what its row records they cost is answered, as to a later call.
func (s *Store) claimOwnHold(req AdmitRequest, h existingHold, r *batchReads) AdmitResult {
	if h.State == StateSettled {
		return AdmitResult{Err: ErrRunSettled}
	}
	hold := Hold{RunID: h.RunID, UserID: h.UserID, State: h.State, HeldMicro: h.HeldMicro,
		CapMicro: h.CapMicro, DiscountBP: h.DiscountBP, RecordedMicro: h.CostMicro}
	if u, ok := r.users[req.UserID]; ok {
		hold.MaxInFlight = s.plan(u).MaxInFlight
	}
	return AdmitResult{Hold: hold}
}

// readmit decides the admission of a run admitted before (a retry, a redelivery, a later call
// of a named run): no second hold is taken. It reports the write that pushes the run's expiry
// out, when there is one.
func readmit(req AdmitRequest, h existingHold, u userRow, plan Plan, r *batchReads) (AdmitResult, admittedRow, bool) {
	switch {
	case h.UserID != req.UserID:
		return refused(ErrRunNotFound)
	case h.State == StateSettled:
		return refused(ErrRunSettled)
	}
	if !h.Live && req.ClientRunID != "" {
		// The run's hold had expired: the aggregate no longer counts it in flight,
		// and charges may have landed since (its held it still counts: the run is
		// owed). Pushing its expiry out brings it back, so it must fit the limits
		// again, as a new hold would.
		t := r.live[req.UserID]
		if t.InFlight >= plan.MaxInFlight {
			return refused(&TooManyInFlightError{InFlight: t.InFlight, OpenRuns: t.OpenRuns, Limit: plan.MaxInFlight})
		}
		owed := owedMicro(h.HeldMicro, h.CapMicro, h.CostMicro, h.DiscountBP)
		if Available(plan.AllowanceMicro, t.UsedToday, u.PrepaidMicro, t.Held-owed) < owed {
			return refused(insufficient(u.PrepaidMicro))
		}
		t.InFlight++
		t.OpenRuns++
		h.Live = true
		r.existing[req.RunID] = h
	}
	hold := Hold{RunID: h.RunID, UserID: h.UserID, State: h.State, HeldMicro: h.HeldMicro,
		CapMicro: h.CapMicro, DiscountBP: h.DiscountBP, Existing: true, MaxInFlight: plan.MaxInFlight,
		RecordedMicro: h.CostMicro}
	// A later call of a named run: its expiry moves out now, not when the call ends,
	// so the run cannot expire (and be reconciled) under the call. Not a retry of a
	// request still running (an Idempotency-Key, a redelivery): it is answered, not
	// run, and must not keep alive a hold whose process may have died.
	if req.ClientRunID == "" {
		return AdmitResult{Hold: hold}, admittedRow{}, false
	}
	return AdmitResult{Hold: hold}, admittedRow{hold: hold, req: req, expires: r.now.Add(req.TTL), existing: true}, true
}

// admitNew decides the admission of a run not admitted before, and the write of its new hold
// when it is admitted: the heavy or the normal tier of the plan, and the plan's run cap, each
// at most what the user has available.
func admitNew(req AdmitRequest, u userRow, plan Plan, r *batchReads) (AdmitResult, admittedRow, bool) {
	t := r.live[req.UserID]
	if t.InFlight >= plan.MaxInFlight {
		return refused(&TooManyInFlightError{InFlight: t.InFlight, OpenRuns: t.OpenRuns, Limit: plan.MaxInFlight})
	}
	available := Available(plan.AllowanceMicro, t.UsedToday, u.PrepaidMicro, t.Held)
	if available <= 0 {
		return refused(insufficient(u.PrepaidMicro))
	}
	tier := plan.HoldNormalMicro
	if req.Heavy || (req.UserTurns > 0 && req.UserTurns >= plan.HeavyAfterTurns) {
		tier = plan.HoldHeavyMicro
	}
	hold := Hold{RunID: req.RunID, UserID: req.UserID, State: req.State,
		HeldMicro: min(tier, available), CapMicro: min(plan.MaxRunCostMicro, available), DiscountBP: plan.DiscountBP,
		MaxInFlight: plan.MaxInFlight}
	t.InFlight++
	if req.ClientRunID != "" {
		t.OpenRuns++
	}
	t.Held += hold.HeldMicro
	// A second admission of the same run later in this batch finds this one.
	r.existing[req.RunID] = existingHold{RunID: hold.RunID, UserID: hold.UserID, State: hold.State,
		HeldMicro: hold.HeldMicro, CapMicro: hold.CapMicro, DiscountBP: hold.DiscountBP,
		Token: sql.NullString{String: req.Token, Valid: req.Token != ""}, Live: true}
	return AdmitResult{Hold: hold}, admittedRow{hold: hold, req: req, expires: r.now.Add(req.TTL)}, true
}

// refused is readmit's and admitNew's answer to an admission they refuse: nothing to write.
func refused(err error) (AdmitResult, admittedRow, bool) {
	return AdmitResult{Err: err}, admittedRow{}, false
}

// appendInsertHolds writes a batch's holds in one statement. A duplicate key is impossible
// while every admission of a run locks its user first and looks the run up (fresh ids are
// random, and a second admission of a run in the same batch finds the first); if it ever
// happens the whole batch fails, not retried, and each of its callers gets the error.
func appendInsertHolds(sc *script, rows []admittedRow) {
	rows = slices.DeleteFunc(slices.Clone(rows), func(r admittedRow) bool { return r.existing })
	if len(rows) == 0 {
		return
	}
	q := make([]byte, 0, 200+len(rows)*48)
	q = append(q, "INSERT INTO run_holds (run_id, user_id, client_run_id, session_id, state, held_micro, cap_micro, model, discount_bp, expires_at, admit_token, price_snapshot, served_by) VALUES "...)
	args := make([]any, 0, len(rows)*13)
	for i, r := range rows {
		if i > 0 {
			q = append(q, ',')
		}
		q = append(q, "(?, ?, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?, NULLIF(?, ''))"...)
		args = append(args, r.hold.RunID, r.hold.UserID, r.req.ClientRunID, r.req.SessionID, r.hold.State,
			r.hold.HeldMicro, r.hold.CapMicro, r.req.Model, r.hold.DiscountBP, r.expires, r.req.Token, nullJSON(r.req.PriceSnapshot),
			r.req.ServedBy)
	}
	sc.add(string(q), args...)
}

// appendExtendHolds pushes out the expiry of runs admitted again, never pulling one in. It
// goes with the batch's other writes of holds, before the day ledger's (the lock order); a
// run admitted twice in one batch has no row yet for its second admission to extend.
func appendExtendHolds(sc *script, rows []admittedRow) {
	for _, r := range rows {
		if r.existing {
			sc.add("UPDATE run_holds SET expires_at = GREATEST(expires_at, ?) WHERE run_id = ? AND state IN ('queued', 'running')",
				r.expires, r.hold.RunID)
		}
	}
}

// Available is what a user may still spend: the rest of today's allowance, plus prepaid
// credits (negative when in debt), minus what live holds reserve (each its hold, or what its
// run's calls have used when that is more: owedMicro).
// It saturates rather than wraps: an allowance override and prepaid credits the admin API
// accepts may together pass MaxInt64 (credit_micro 10^7 and a 12-digit allowance), and a
// wrapped sum is a rich user refused as insufficient.
func Available(allowance, usedToday, prepaid, held int64) int64 {
	a := max(0, allowance-usedToday)
	switch {
	case prepaid > 0 && a > math.MaxInt64-prepaid:
		a = math.MaxInt64
	default:
		a += prepaid
	}
	if held > 0 && a < math.MinInt64+held {
		return math.MinInt64
	}
	return a - held
}

// runSpentMicro is what a live run's calls have used so far as its row records them (a named
// run's ended calls, RecordRunCall; 0 for a call's own run until it settles), at what its
// settlement would charge for it: discounted, at most its cap.
func runSpentMicro(capMicro, costMicro int64, discountBP int) int64 {
	return min(capMicro, pricing.ApplyDiscount(max(costMicro, 0), discountBP))
}

// owedMicro is what a live hold counts against its user's balance: what it holds, or what its
// run's calls have already used when that is more. A named run's calls may spend up to its
// cap, past its hold; counting only the hold let the user's new calls be admitted against
// credits those calls had spent, and /v1/credits showed them available until the settlement.
func owedMicro(heldMicro, capMicro, costMicro int64, discountBP int) int64 {
	return max(heldMicro, runSpentMicro(capMicro, costMicro, discountBP))
}

// spentSQL is runSpentMicro of a run_holds row, in SQL: the same exact integer arithmetic as
// pricing.ApplyDiscount (no product overflows), so the admission aggregate and the balance
// count what decideSettlements and readmit count.
const spentSQL = `LEAST(cap_micro, CASE WHEN cost_micro <= 0 OR discount_bp >= 10000 THEN 0
	WHEN discount_bp <= 0 THEN cost_micro
	ELSE (cost_micro DIV 10000) * (10000 - discount_bp) + ((cost_micro MOD 10000) * (10000 - discount_bp) + 9999) DIV 10000 END)`

// owedSQL is owedMicro of a run_holds row, in SQL.
const owedSQL = "GREATEST(held_micro, " + spentSQL + ")"
