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

// PauseRefundKey is the idempotency key of the grant that gives back what runID's hold was
// charged (SourceReconcileHold) beyond what its call used: one refund per run, whichever process
// sends it — the call's own, or a reconciler's pass that read the call's tally or its
// admission's refusal (refundPaused) — and however often, whether or not the call was forwarded.
func PauseRefundKey(runID string) string { return "pause-refund:" + runID }

// PauseRefunded returns what the pause refund of userID's run runID (the grant keyed
// PauseRefundKey) gave back, 0 when none was made, and whether it was granted for a call that
// answered nothing: one never forwarded (UnforwardedRefundReason, or a reconciler's pass from
// its admission's refusal) or one its upstream refused (UpstreamRefusedRefundReason). A whole
// refund alone does not say so: a call forwarded and answered at no cost (a plan's discount of
// 10 000 bp) is given back all of its charge too
// (proxy's TestIdemResumedAttemptThatAnsweredFreeIsNotRunAgainOnceRedisLostTheRecord).
func (s *Store) PauseRefunded(ctx context.Context, userID uint64, runID string) (amount int64, answeredNothing bool, err error) {
	var g struct {
		Amount int64  `db:"amount_micro"`
		Reason string `db:"reason"`
	}
	err = s.db.GetContext(ctx, &g, "SELECT amount_micro, reason FROM grants WHERE idempotency_key = ? AND user_id = ?",
		PauseRefundKey(runID), userID)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read the pause refund of run %s: %w", runID, err)
	}
	switch g.Reason {
	case UnforwardedRefundReason, UpstreamRefusedRefundReason, refusedRefundReason:
		return g.Amount, true, nil
	}
	return g.Amount, false, nil
}

// The reasons of a pause refund granted for a call that answered nothing, by its own process
// or by a pass from its zero tally's settlement source (tallyRefundReason):
// UnforwardedRefundReason for one never forwarded (released, or a duplicate),
// UpstreamRefusedRefundReason for one forwarded and refused by its upstream (settled
// upstream_error, at 0). PauseRefunded tells such a refund by them.
const (
	UnforwardedRefundReason     = "refund: hold charged (reconcile_hold) while its gateway was stopped; the call was never forwarded"
	UpstreamRefusedRefundReason = "refund: hold charged (reconcile_hold) before its call settled; the call was refused by its upstream and used nothing"
)

// PauseRefund is what of run's charge a settlement of its one call costing costMicro at list
// price, had it found the hold open, would not have charged (refund), and what it would have
// charged beyond it (uncharged: the call used more than its hold, whose charge stands; nothing
// more is taken). That settlement would have charged the discounted cost clamped to the hold's
// cap, or the hold for one that charges it (chargeHeld), as decideSettlements does. The
// gateway's refund and the reconciler's compute it alike: one grant key, one amount.
func PauseRefund(run Run, costMicro int64, chargeHeld bool) (refund, uncharged int64) {
	own := min(pricing.ApplyDiscount(costMicro, run.DiscountBP), run.CapMicro)
	if chargeHeld {
		own = run.HeldMicro
	}
	return max(0, run.ChargedMicro-own), max(0, own-run.ChargedMicro)
}

// reconciledRefundReason is the reason of a pause refund a reconciler's pass granted from the
// call's tally; refusedRefundReason of one it granted from the mark of its admission's refusal.
const (
	reconciledRefundReason = "refund: hold charged (reconcile_hold) before its call settled; the call's tally, written after, says it used less (or nothing)"
	refusedRefundReason    = "refund: hold charged (reconcile_hold) before its admission's refusal was marked; nothing was forwarded on it"
)

// tallyRefundReason is the reason of a pause refund a pass grants from tally: the one the
// call's own process would have given (refundPausedHold in proxy) for a call that answered
// nothing — never forwarded (release, duplicate, a lost admission's release) or refused by its
// upstream — when its zero tally says it was settled so; else reconciledRefundReason. An
// Idempotency-Key's retry reads it once Redis lost the key's record (PauseRefunded): under the
// generic reason an attempt its upstream refused, its process killed before its own refund,
// was taken for one that answered, and the retry was refused 409 idempotent_response_lost. A
// tally with figures answered something, whatever source it names.
func tallyRefundReason(tally RunTally) string {
	if tally.CostMicro != 0 || tally.Usage != (pricing.Usage{}) {
		return reconciledRefundReason
	}
	switch tally.Source {
	case SourceUpstreamError:
		return UpstreamRefusedRefundReason
	case SourceRelease, SourceDuplicate, SourceAdmitLost:
		return UnforwardedRefundReason
	}
	return reconciledRefundReason
}

// heldCursor is where the next pass's revisit of the runs charged their hold goes on: the
// last one read, by (settled_at, run_id). The zero value starts at the oldest in the window.
type heldCursor struct {
	SettledAt time.Time
	RunID     string
}

// chargedHeld lists up to limit one-call runs (no client run id) settled SourceReconcileHold
// at a charge above 0 within window of the database's clock, after the cursor, that have no
// pause refund yet (no grant keyed PauseRefundKey): the runs a pass revisits (refundPaused).
// A range read of idx_run_holds_source_settled, each row's grant looked up by its unique key.
func (s *Store) chargedHeld(ctx context.Context, after heldCursor, window time.Duration, limit int) ([]Run, error) {
	if limit <= 0 || limit > maxListRows {
		panic(fmt.Sprintf("holds: charged-held batch %d out of range", limit))
	}
	q, args := chargedHeldQuery(after, window, limit)
	var out []Run
	if err := s.db.SelectContext(ctx, &out, q, args...); err != nil {
		return nil, fmt.Errorf("list runs charged their hold: %w", err)
	}
	return out, nil
}

// chargedHeldQuery is chargedHeld's statement and its arguments.
func chargedHeldQuery(after heldCursor, window time.Duration, limit int) (string, []any) {
	q := "SELECT " + runColumns + ", admit_token FROM run_holds WHERE settle_source = ? AND settled_at >= NOW(6) - INTERVAL ? MICROSECOND" +
		" AND state = ? AND client_run_id IS NULL AND charged_micro > 0"
	args := []any{SourceReconcileHold, window.Microseconds(), StateSettled}
	if after.RunID != "" {
		// The plain bound keeps the index range tight; the OR breaks ties in settled_at.
		q += " AND settled_at >= ? AND (settled_at > ? OR run_id > ?)"
		args = append(args, after.SettledAt, after.SettledAt, after.RunID)
	}
	q += " AND NOT EXISTS (SELECT 1 FROM grants g WHERE g.idempotency_key = CONCAT('pause-refund:', run_holds.run_id))" +
		" ORDER BY settled_at, run_id LIMIT ?"
	args = append(args, limit)
	return q, args
}

// refundPaused revisits the one-call runs charged their hold (reconcile_hold) within
// RefundWindow that have no pause refund, a batch of cfg.Batch at a time, and gives back by
// grant (PauseRefundKey) what each one's tally, written after the charge, says its call did not
// use — or, with no tally, the whole charge of a hold its own admission's request marked
// refused after it (Refusals). It reports how many it granted. It starts none after stopAt,
// the pass's time budget, in which the scan and the sessions' prune go first: a backlog of
// expired holds holds credits now, and ended sessions pile up by the minute, while a refund
// can wait as long as its tally lives; the next pass goes on after the last run it handled.
//
// Why: a call whose process was stopped (SIGSTOP, a VM's live migration) past its hold's life,
// or whose lease lapsed, had its hold taken for a dead process's and charged whole; once
// resumed, the call ended, wrote its tally and its settlement found the run settled. The
// process refunds the difference itself, but a process killed between that settlement and the
// grant, or whose database stayed out of reach through the refund's settle_timeout, left the
// whole hold charged — and the scan never reads a settled run again. The tally is the evidence
// the scan settles from: had it been there at the scan, the run would have been charged what it
// says (the discount applied, clamped to the cap); the refund makes it so. So too for a
// refused admission's hold (the proxy's releaseUnfit, a lost admission's), its process stopped
// between the hold's COMMIT and its refusal's mark, then killed after its release found the run
// settled: the mark is the scan's evidence too (it releases such a hold at 0), and the hold of
// an Idempotency-Key attempt or one too small for its prompt has no tally. Only the request
// that inserted a plain call's hold forwards on it, and a request that marks its admission
// refused forwards on none: nothing was used, and the whole charge is given back.
//
// What it leaves alone:
//   - a run whose call truly died (no tally, ever, nor a mark of its hold's admission refused,
//     by the token the hold carries: another's token is no word on it): that is what
//     reconcile_hold charges;
//   - a run a live process still serves (a lease, or this process's own call): that process
//     settles and refunds it at its own figures, which are the call's whole ones (its tally may
//     still hold its final event's, to be set right beside the settlement); the run is
//     revisited once its lease is gone;
//   - a tally written within RefundAfter (a lease TTL): its process, resumed from a pause, may
//     not have beaten its lease again yet and may still set it right; the next pass reads it;
//   - a tally that is no record of one call's usage (unreadable, corrupt, impossible figures,
//     more than one call), or a mark that cannot be read: no refund on it;
//   - a call that used its charge or more: nothing to give back; its charge stands;
//   - a named run (its hold is many calls'), never listed.
//
// The grant is the gateway's, by key: whichever comes first pays, the other finds it. With the
// same figures the amounts are equal and the second is a replay. The tally is read before the
// lease, and only once it has stood RefundAfter: a live process, resumed, beats its lease again
// within a lease TTL (its heartbeat is at most half of one), so a pass that sees no lease then
// is not racing a correction to come. A process whose refund comes after this one with other
// figures — its tally set right (usage reported after the final event) after this pass read it:
// the process was stopped again, past a lease TTL, between its final event's write and its
// correction — is refused ErrGrantKeyReused and logs it: the run is charged what its final event
// had, as a settlement from that tally would have charged it; the loss is the reconciler's own
// when it settles from a tally. The age is from the write's time the tally holds, Redis's
// clock (RunTally.Age), whatever tally_ttl its writer had; only a tally written by a gateway of
// before that field (a rolling upgrade) is aged by its TTL run down, and from a gateway with a
// longer tally_ttl than this one's looks younger by the difference (twice as long or more: no
// pass refunds it), one with a shorter older. Each grant is its own transaction (the user's
// row, then the grant's), never inside the scan's.
func (r *Reconciler) refundPaused(ctx context.Context, stopAt, end time.Time) (granted int) {
	r.mu.Lock()
	after := r.heldResume
	r.mu.Unlock()
	for time.Now().Before(stopAt) {
		lctx, cancel := context.WithTimeout(ctx, min(r.itemTimeout, time.Until(end)))
		runs, err := r.cfg.Store.chargedHeld(lctx, after, r.cfg.RefundWindow, r.cfg.Batch)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.cfg.Log.Warn("reconcile: runs charged their hold not revisited; the next pass tries again", zap.Error(err))
			}
			return granted
		}
		for _, run := range runs {
			if ctx.Err() != nil || !time.Now().Before(stopAt) {
				// The next pass goes on after the last run handled.
				r.resumeHeld(after)
				return granted
			}
			after = heldCursor{SettledAt: run.SettledAt.Time, RunID: run.RunID}
			if r.refundOne(ctx, run, end) {
				granted++
			}
		}
		if len(runs) < r.cfg.Batch {
			r.resumeHeld(heldCursor{})
			return granted
		}
	}
	r.resumeHeld(after)
	return granted
}

// resumeHeld is where the next pass's refundPaused goes on.
func (r *Reconciler) resumeHeld(c heldCursor) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heldResume = c
}

// refundOne is refundPaused's work on one run, and reports whether it granted a refund.
func (r *Reconciler) refundOne(ctx context.Context, run Run, end time.Time) bool {
	ctx, cancel := context.WithTimeout(ctx, min(r.itemTimeout, time.Until(end)))
	defer cancel()
	log := r.cfg.Log.Named(MoneyLog).With(zap.String("run_id", run.RunID), zap.Uint64("user_id", run.UserID))
	tally, found, err := r.cfg.Usage.Tallied(ctx, run.RunID)
	if err != nil || (found && tally.Age < r.cfg.RefundAfter) {
		// A corrupt or unreadable tally is no evidence of a smaller use; one written within
		// RefundAfter may be set right yet, and the next pass reads it again.
		return false
	}
	// Asked after the tally: a tally that had stood for RefundAfter when read is of a process
	// that, if it lives, has beaten its lease again since.
	leased, err := r.cfg.Leases.Exists(ctx, run.RunID)
	if err != nil || leased {
		// A live process refunds it at its own figures; unknown, the next pass asks again.
		return false
	}
	reason := tallyRefundReason(tally)
	if !found {
		// No tally: the call died with its usage (the charge stands) or has not ended yet —
		// unless the request that inserted the hold (its token) marked its admission refused,
		// after the charge: nothing was forwarded on it, and the scan, had it seen the mark,
		// would have released it at 0. Its refund is the whole charge, as a call's that cost 0.
		if r.cfg.Refusals == nil || !run.AdmitToken.Valid || run.AdmitToken.String == "" {
			return false
		}
		if refused, err := r.cfg.Refusals.Refused(ctx, run.RunID, run.AdmitToken.String); err != nil || !refused {
			return false
		}
		tally, reason = RunTally{}, refusedRefundReason
	}
	if !TallyBelievable(tally.Usage, tally.CostMicro, tally.Calls) || tally.Calls > 1 {
		return false
	}
	refund, uncharged := PauseRefund(run, tally.CostMicro, false)
	if refund == 0 {
		if uncharged > 0 {
			log.Debug("reconcile: run charged its hold; its call's tally says it used more, and the charge stands",
				zap.Int64("charged_micro", run.ChargedMicro), zap.Int64("uncharged_micro", uncharged))
		}
		return false
	}
	g, created, err := r.cfg.Store.Grant(ctx, GrantRequest{UserID: run.UserID, AmountMicro: refund,
		IdempotencyKey: PauseRefundKey(run.RunID), Reason: reason})
	switch {
	case errors.Is(err, ErrGrantKeyReused):
		log.Warn("reconcile: run charged its hold was refunded by its call's process, at other figures than its tally's; that refund stands",
			zap.Int64("charged_micro", run.ChargedMicro), zap.Int64("tally_refund_micro", refund), zap.Error(err))
		return false
	case err != nil:
		log.Warn("reconcile: refund of a run charged its hold failed; the next pass tries again",
			zap.Int64("charged_micro", run.ChargedMicro), zap.Int64("refund_micro", refund), zap.Error(err))
		return false
	}
	log.Warn("reconcile: run charged its hold; what its call's tally (or its admission's refusal) says it did not use given back by grant",
		zap.Int64("charged_micro", run.ChargedMicro), zap.Int64("refund_micro", refund), zap.Int64("cost_micro", tally.CostMicro),
		zap.Int64("calls", tally.Calls), zap.Bool("refused", !found), zap.Uint64("grant_id", g.ID), zap.Bool("created", created))
	return created
}
