package proxy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/tollgate/tollgate/holds"
	"go.uber.org/zap"
)

// releaseLostAdmission closes the hold a failed admission may have left: when the database
// may have committed it although the answer was lost (holds.ErrOutcomeUnknown), the caller is
// refused, so the hold must not be charged. It is settled at 0 in the background with the
// admission's token, which closes this request's hold and never one another request took on
// the same run (an Idempotency-Key retry). Before that, in the request, the admission is
// marked refused (markRefused): if the release never lands (the outage outlasts the hold, or
// the process dies first), the reconciler releases the hold carrying this token at 0 rather
// than charging what it held. A fresh run id (made up at random for this request) also gets a
// zero tally.
//
// A named run (X-Run-Id) is not released: other calls of it may already be running on the
// hold (the caller's retry, a parallel call, on any process), and a failed call leaves a run
// open. It gets a zero tally instead (retried for as long as a settlement would), so that a run
// nobody comes back to is settled at what its calls used.
// Any other failed admission held nothing, and this does nothing.
//
// The work takes a settlement slot, or runs in the request when none is free: the refused
// caller is answered at once and may send the next request, so a goroutine per lost admission,
// each living as long as the release tries, grew with the request rate while the database lost
// commit replies.
func (s *Server) releaseLostAdmission(ctx context.Context, ar holds.AdmitRequest, err error, log *zap.Logger) {
	if !errors.Is(err, holds.ErrOutcomeUnknown) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	log = log.Named(holds.MoneyLog)
	if ar.ClientRunID != "" {
		log.Warn("admission outcome unknown; the run stays open", zap.Error(err))
		s.settlements.start()
		s.inBackground(func() {
			defer s.settlements.leave()
			s.markRunUnused(ctx, ar.RunID, log)
		})
		return
	}
	log.Warn("admission outcome unknown; releasing whatever it may have held", zap.Error(err))
	s.markRefused(ctx, ar, log)
	s.releaseRefused(ctx, ar, log)
}

// releaseRefused is releaseLostAdmission's release of a plain call's hold once it is marked
// refused (markRefused): a zero tally for a fresh run, then the release at 0 by the
// admission's token, in a settlement slot or, with none free, in the request. A release in
// a slot that gives up reads the run again for its pause refund (refundAfterFailedRelease), as
// one that finds it settled does (refundUnforwardedHold). ctx has no cancellation; log is the
// money log.
func (s *Server) releaseRefused(ctx context.Context, ar holds.AdmitRequest, log *zap.Logger) {
	s.settlements.start()
	release := func(keepTrying bool) {
		defer s.settlements.leave()
		if ar.Fresh {
			tctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
			if err := s.tally.MarkCallUnused(tctx, ar.RunID, holds.SourceAdmitLost); err != nil {
				log.Warn("unused tally not written", zap.Error(err))
			}
			cancel()
		}
		res, err := s.releaseLost(ctx, ar, keepTrying, log)
		switch {
		case errors.Is(err, holds.ErrRunNotFound):
			log.Info("the lost admission had held nothing")
		case err != nil:
			s.metrics.SettleFailures.Inc()
			log.Error("lost admission not released; the reconciler will settle it", zap.Error(err))
			if keepTrying {
				// Given up after the hold's life: the reconciler settles only a run still open,
				// and one a peer charged whole (reconcile_hold) while this process was stopped
				// before its mark is read again only by a pass's revisit, from the zero tally or
				// the mark if one landed (holds' refundPaused). Read now, as a call's failed
				// settlement reads its run (refundAfterFailedSettlement); not in the request,
				// whose 503 must not wait on the database a second time.
				s.refundAfterFailedRelease(ctx, ar, log)
			}
		default:
			s.metrics.Settlements.WithLabelValues(holds.SourceAdmitLost, strconv.FormatBool(res.Applied)).Inc()
			log.Info("lost admission released", zap.Bool("applied", res.Applied))
			if !res.Applied {
				s.refundUnforwardedHold(ctx, ar, log)
			}
		}
	}
	// In the request (no slot free), one try: the caller's 503 waits for it, and must not wait
	// for an outage to end. The try is settle_timeout or, once a batch has taken the release,
	// that batch's own bound (holds.Writer.Settle): a retry's settle_timeout more at most, and
	// a stalled COMMIT's wait up to the DSN's readTimeout.
	if !s.tryBackground(func() { release(true) }) {
		release(false)
	}
}

// admit takes ar's hold through the batch writer. Once a worker has taken an admission, its
// request waits for the batch's outcome whatever its context says, up to the driver's read
// timeout when the database took the COMMIT and has not answered: past the exit's bound of a
// graceful shutdown (shutdown_timeout + settle_timeout + 5 s) when that is shorter. The
// process then exited before the request learnt the outcome, and the committed hold, with no
// lease, no tally and no mark of its refusal, was charged what it held by the reconciler,
// though its call was never forwarded. A call cut at the drain's deadline is never forwarded
// whatever its admission's outcome, so when the cut comes while the admission is out, the
// admission is marked as a lost one is (markLost), and the reconciler releases such a hold at
// 0. The mark is counted as a settlement, so that the drain waits for it.
//
// The mark follows the cut (s.cut), not the request's context: a request whose caller left
// first (a client's timeout, which a stalled database brings about) had its context end before
// the cut, for another cause, and its hold was charged all the same. A cut during the
// admission ends ctx too (cuttable), but from another goroutine: admit waits for that before
// it returns, so that a call marked refused is never forwarded.
//
// from, when not nil, is noted the session's current run before the admission's first wait
// for a settlement (admitWaitingForSettlements): nil for a call that has no claim to make so.
func (s *Server) admit(ctx context.Context, ar holds.AdmitRequest, log *zap.Logger, from *sessionFrom) (holds.Hold, error) {
	s.settlements.start()
	var once sync.Once
	leave := func() { once.Do(s.settlements.leave) }
	stop := context.AfterFunc(s.cut, func() {
		defer leave()
		s.markLost(context.WithoutCancel(ctx), ar, log)
	})
	hold, err := s.admitWaitingForSettlements(ctx, ar, log, from)
	if stop() {
		leave()
	} else {
		<-ctx.Done()
	}
	return hold, err
}

// admitWaitingForSettlements takes ar's hold through the batch writer. Refused for want of a
// max_in_flight slot, or of credits, while some of its user's calls on this process are
// settling (their answers over, their holds still live: settlingUsers), it waits for one of
// those settlements to end and tries again, up to maxSettlingWaits times within ctx: a slot
// frees, and what a call held beyond its cost is given back, when a call ends, not when its
// settlement reaches the database. A refusal with none settling stands, as does one whose try
// again the budget left no time to start (ErrAdmitNotStarted: nothing held): its caller is told
// 429 too_many_in_flight or 402 insufficient_credits, not 503 billing_unavailable.
//
// A session's call notes its session's current run in from (sessionFrom) before its first
// wait, as admitFitting's does before its release: a newer message of its session may take the
// slot or the credits a settlement gives back while it waits, and claim the session; its own
// claim, once admitted, then must not take the session back (ClaimSessionFrom).
func (s *Server) admitWaitingForSettlements(ctx context.Context, ar holds.AdmitRequest, log *zap.Logger, from *sessionFrom) (holds.Hold, error) {
	var refused error
	for waits := 0; ; waits++ {
		seen := s.settling.mark(ar.UserID)
		s.beforeStep(ctx, stepAdmit)
		hold, err := s.writer.Admit(ctx, ar)
		next := s.settling.after(ar.UserID, seen)
		switch {
		case refused != nil && errors.Is(err, holds.ErrAdmitNotStarted):
			return holds.Hold{}, refused
		case !settlementMayLift(err) || waits == maxSettlingWaits:
			return hold, err
		}
		refused = err
		if next == nil {
			return hold, err
		}
		if ar.SessionID != "" && from != nil && !from.known {
			*from = s.currentSessionRun(ctx, ar.UserID, ar.SessionID, log)
		}
		s.beforeStep(ctx, stepAdmitWaits)
		select {
		case <-next:
		case <-ctx.Done():
			return hold, err
		}
	}
}

// settlementMayLift reports whether err refuses an admission for what a settling call of its
// user may give back as its settlement lands: a max_in_flight slot, or credits its hold keeps
// held (a user at the end of its balance, whose every call's hold takes all it has left, had
// its next call refused 402 "held by calls in flight" with none in flight; no SDK retries a 402).
func settlementMayLift(err error) bool {
	var busy *holds.TooManyInFlightError
	return errors.As(err, &busy) || errors.Is(err, holds.ErrInsufficient)
}

// maxSettlingWaits bounds how often one admission waits for its user's settlements: each wait
// ends with one of them, so a user whose calls keep ending cannot keep it waiting past a few.
const maxSettlingWaits = 4

// admitFitting is admit for a call whose run id was made up for it (ar.Fresh), with one more
// wait: a hold granted while calls of its user on this process are settling may be only what
// their holds left (min(tier, available)), a cap too small for the prompt and the least answer,
// which fitBudget refuses 402 — though the settlement about to land gives back what the call
// needs, and the same call sent a moment later is served. Such a hold is released at 0 in the
// request and, once one of those settlements has ended, the call is admitted again under a new
// run id and token, up to maxSettlingWaits times within ctx (the admission's budget). With
// none of its user's calls settling, once the waits are spent, or once a settlement waited
// for has not raised the cap (the plan's max_run_cost binds, or another call took what it
// gave back), the hold is kept whatever it pays for, and fitBudget refuses it at once. ar is
// left the admission last tried (the released one when the next never started).
//
// callLog is the request's logger without a run id: each admission's lines (its mark at the
// drain's cut, its release) name its own run, and a line of the first run's id about a later
// hold (its COMMIT unanswered, released in the background) sent an operator to a run released
// at 0 and left the hold's own run id in no line.
//
// A session's call that waits notes its session's current run first, in from (sessionFrom),
// before its hold is released: a newer message of its session may be admitted on what it gave
// back, and claim the session, while it waits; its own claim then must not take the session
// back (ClaimSessionFrom).
//
// reqCtx is the request's own context (cuttable), which the drain's cut ends even once ctx,
// the admission's budget, is spent: the cut ends a release's wait by it (releaseUnfit).
func (s *Server) admitFitting(ctx, reqCtx context.Context, ar *holds.AdmitRequest, fits func(holds.Hold) bool, callLog *zap.Logger,
	from *sessionFrom) (holds.Hold, error) {
	if !ar.Fresh {
		return s.admit(ctx, *ar, callLog.WithLazy(zap.String("run_id", ar.RunID)), from)
	}
	lastCap := int64(-1)
	// atOnce: the last wait ended at once, for a settlement that ended while that admission
	// was under way, which its cap may already count: this admission's cap, not raised by
	// it, says nothing of what a settlement gives back, and the next one is waited for.
	// Taken as one that did not raise the cap, it refused 402 a call another settlement, still
	// to land, would have paid for.
	atOnce := false
	var released holds.AdmitRequest
	for waits := 0; ; waits++ {
		log := callLog.WithLazy(zap.String("run_id", ar.RunID))
		seen := s.settling.mark(ar.UserID)
		hold, err := s.admit(ctx, *ar, log, from)
		next := s.settling.after(ar.UserID, seen)
		switch {
		case waits > 0 && errors.Is(err, holds.ErrAdmitNotStarted):
			// Nothing held, the budget spent: answered as the released hold would have been,
			// and named by it.
			*ar = released
			return holds.Hold{}, errUnfitReleased
		case err != nil || next == nil || waits == maxSettlingWaits || (hold.CapMicro <= lastCap && !atOnce) || fits(hold):
			return hold, err
		}
		lastCap, atOnce = hold.CapMicro, next == closedChan
		if ar.SessionID != "" && !from.known {
			*from = s.currentSessionRun(ctx, ar.UserID, ar.SessionID, log)
		}
		if !s.releaseUnfit(ctx, reqCtx, *ar, log) {
			return holds.Hold{}, errUnfitNotReleased
		}
		s.beforeStep(ctx, stepAdmitWaits)
		select {
		case <-next:
		case <-ctx.Done():
			return holds.Hold{}, errUnfitReleased
		}
		// The released run is settled: a new admission needs a run of its own.
		released = *ar
		ar.RunID, ar.Token = newRunID(), newAdmitToken()
	}
}

// sessionFrom is a session's current run as a call of it that waited for its admission read
// it before the wait (admitFitting): known false when it was not read (no wait, or the read
// failed), and its claim is then as any other's.
type sessionFrom struct {
	known bool
	run   string // "" for a session with no row: none current
}

// currentSessionRun reads sessionID's current run for admitFitting, within ctx (a store
// step's bound). A read that fails leaves it unknown, logged: the claim then is as before.
func (s *Server) currentSessionRun(ctx context.Context, userID uint64, sessionID string, log *zap.Logger) sessionFrom {
	sctx, cancel := s.storeContext(ctx)
	defer cancel()
	ref := holds.SessionRef{UserID: userID, SessionID: sessionID}
	runs, err := s.store.CurrentSessionRuns(sctx, []holds.SessionRef{ref})
	if err != nil {
		log.Warn("session's current run not read before the admission's wait; a newer message claiming it meanwhile is replaced", zap.Error(err))
		return sessionFrom{}
	}
	return sessionFrom{known: true, run: runs[ref]}
}

// errUnfitReleased is admitFitting's refusal of a call whose hold it released (too small for
// the prompt) and could not replace: answered as fitBudget answers such a hold, 402.
var errUnfitReleased = errors.New("hold too small for the prompt released; no larger one admitted")

// errUnfitNotReleased is admitFitting's refusal of a call whose too small hold's release failed
// (releaseUnfit): the database, not the caller's credits, stopped it, and it is answered as
// any admission the database failed, 503 billing_unavailable, which the SDKs retry. Answered
// 402 for its prompt, as one whose larger hold was refused, it was an error no SDK retries, for
// a prompt the settlement it was to wait for may well have paid for.
var errUnfitNotReleased = errors.New("hold too small for the prompt not released; not admitted again")

// releaseUnfit releases at 0, in the request, the hold ar took (admitFitting), one try of
// settle_timeout, whether or not the caller is still there. The admission is marked refused
// first (markRefused), as a lost one is: the hold is running, and has no lease nor tally until
// it is forwarded, so a process killed while the release was on its way (or before it was
// sent) left it to the reconciler's rule for such a hold, charged what it held, for a call
// the gateway had decided not to forward; marked, the reconciler releases it at 0
// (admit_lost). One Redis write on a rare path: a settlement of the user's was under way.
// A release that fails is handed on as a lost admission's is (releaseRefused: a zero tally,
// released in the background), and false is returned: the call is refused 503, not admitted
// again (errUnfitNotReleased).
//
// The drain's cut of the request (reqCtx) ends the wait, not the release, handed on as a
// failed one: the cut caller is told 503 shutting_down while its connection is still open.
// Waited out, a release the database held past cutGrace left the caller's connection closed
// unanswered. The request's cut, not the server's, ends it: the server's cut ends the request
// and this wait each in a goroutine of its own, in no set order, and a refusal that looked at
// the request before its cut landed answered the cut caller 503 billing_unavailable. Ended
// after the request's context, the wait returns to a refusal that sees the cut. A caller who
// left does not end it, nor does a cut that comes after.
func (s *Server) releaseUnfit(ctx, reqCtx context.Context, ar holds.AdmitRequest, log *zap.Logger) bool {
	ctx = context.WithoutCancel(ctx)
	s.markRefused(ctx, ar, log.Named(holds.MoneyLog))
	tctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
	defer cancel()
	cut := make(chan struct{})
	stop := context.AfterFunc(reqCtx, func() {
		if errors.Is(context.Cause(reqCtx), errDrainDeadline) {
			close(cut)
			cancel() // a release still queued is answered at once, and its goroutine ends
		}
	})
	defer stop()
	// Waited for in a goroutine: once a batch has taken it, holds.Writer.Settle waits for that
	// batch whatever tctx says, up to the batch's own deadline, and the cut must not.
	type released struct {
		res holds.Settled
		err error
	}
	done := make(chan released, 1)
	go func() {
		res, err := s.writer.Settle(tctx, holds.Settlement{RunID: ar.RunID, UserID: ar.UserID, Model: ar.Model,
			AdmitToken: ar.Token, Source: holds.SourceRelease, PriceSnapshot: ar.PriceSnapshot})
		done <- released{res, err}
	}()
	var r released
	select {
	case r = <-done:
	case <-cut:
		r.err = fmt.Errorf("release %s: %w", ar.RunID, context.Cause(reqCtx))
	}
	res, err := r.res, r.err
	if err != nil {
		// Counted among the settlements that gave up only if this one does too.
		mlog := log.Named(holds.MoneyLog)
		mlog.Warn("release of a hold too small for its prompt failed; releasing it as a lost admission's",
			zap.Error(fmt.Errorf("%w: %w", holds.ErrOutcomeUnknown, err)))
		s.releaseRefused(ctx, ar, mlog)
		return false
	}
	s.metrics.Settlements.WithLabelValues(holds.SourceRelease, strconv.FormatBool(res.Applied)).Inc()
	if !res.Applied {
		s.refundUnforwardedHold(ctx, ar, log.Named(holds.MoneyLog))
	}
	return true
}

// refundUnforwardedHold gives back what a peer's reconciler charged the hold ar took
// (reconcile_hold), found settled by its release at 0 (releaseUnfit, releaseRefused): its
// process was stopped (SIGSTOP, a VM's live migration) between the hold's COMMIT and its
// refusal's mark (markRefused) for longer than the hold lives, or than
// holds.dead_instance_after, and the hold, unleased, untallied and unmarked, was taken for a
// killed process's. Nothing was forwarded on it: only the request that inserted a plain call's
// hold (its token) forwards on it, and that request refused it. The whole charge is given back
// as a call never forwarded's is (refundPausedCharge), by the grant keyed by the run: once
// however often sent. ctx has no cancellation; log is the money log.
func (s *Server) refundUnforwardedHold(ctx context.Context, ar holds.AdmitRequest, log *zap.Logger) {
	s.refundRefusedHold(ctx, ar, log,
		"hold of a refused admission found settled by another process, and its run not read; the reconciler refunds a reconcile_hold charge whole within holds.tally_ttl from the refusal's mark: with none, refund it by grant")
}

// refundAfterFailedRelease is refundUnforwardedHold for a refused hold whose release at 0 gave
// up (releaseRefused): the run is read again, as after a call's failed settlement
// (refundAfterFailedSettlement). A hold still open, or one never inserted (the admission's
// outcome unknown), is no refund's; a run that cannot be read leaves its money line, worded
// for a release that failed rather than one that found the hold settled.
func (s *Server) refundAfterFailedRelease(ctx context.Context, ar holds.AdmitRequest, log *zap.Logger) {
	s.beforeStep(ctx, stepRefund)
	s.refundRefusedHold(ctx, ar, log,
		"release of a refused admission's hold failed, and its run not read; the reconciler releases it, or refunds a reconcile_hold charge whole, within holds.tally_ttl from the refusal's mark: with none, refund it by grant")
}

// refundRefusedHold is the work of refundUnforwardedHold and refundAfterFailedRelease; unread is
// the money line of a run that could not be read.
func (s *Server) refundRefusedHold(ctx context.Context, ar holds.AdmitRequest, log *zap.Logger, unread string) {
	if ar.ClientRunID != "" || ar.Token == "" {
		return // a named run's hold is its calls', never released here; no token, no hold of ours to tell
	}
	s.refundPausedHold(ctx, ar.UserID, ar.RunID, ar.Token, holds.Settlement{RunID: ar.RunID, UserID: ar.UserID, Source: holds.SourceRelease}, log, unread)
}

// markLost leaves the reconciler what releaseLostAdmission leaves it before its release: a
// named run's zero tally, or the mark that this request's admission was refused.
func (s *Server) markLost(ctx context.Context, ar holds.AdmitRequest, log *zap.Logger) {
	log = log.Named(holds.MoneyLog)
	if ar.ClientRunID != "" {
		log.Warn("call cut at the drain deadline during its admission; the run stays open")
		s.markRunUnused(ctx, ar.RunID, log)
		return
	}
	log.Warn("call cut at the drain deadline during its admission; marked refused, so that whatever it may hold is released")
	s.markRefused(ctx, ar, log)
}

// markRefused leaves the reconciler the mark that this request's admission (its run and
// token) was refused, in the request, before the 503: the release below runs in this process,
// and a process killed before it lands (the database still out of reach) would otherwise leave
// an Idempotency-Key attempt's committed hold, which has no zero tally, to be charged what it
// held. Bounded as a step on the caller's path; not written, the release and the zero tally (a
// plain call's) are what is left.
func (s *Server) markRefused(ctx context.Context, ar holds.AdmitRequest, log *zap.Logger) {
	if ar.Token == "" {
		return
	}
	s.beforeStep(ctx, stepRefusedMark)
	rctx, cancel := redisStep(ctx)
	defer cancel()
	if err := s.tally.MarkRefused(rctx, ar.RunID, ar.Token); err != nil {
		log.Warn("refused admission's mark not written", zap.Error(err))
	}
}

// releaseLost settles a lost admission's hold at 0 by its token. Each try has settle_timeout;
// while the database stays out of reach it tries again, for as long as the hold lives (its
// TTL, counted from now: no sooner than it expires): the reconciler settles it only once it has
// expired, and then, finding no tally (an Idempotency-Key's attempt gets none, as its run may
// be another request's) nor, if Redis failed that write too, the refusal's mark, at what it
// held. Given up after settle_timeout, the release left the refused caller's hold to that
// whenever the outage outlasted settle_timeout but not hold_ttl.
//
// keepTrying false makes one try only.
func (s *Server) releaseLost(ctx context.Context, ar holds.AdmitRequest, keepTrying bool, log *zap.Logger) (holds.Settled, error) {
	until := time.Now().Add(ar.TTL)
	for {
		tctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
		res, err := s.writer.Settle(tctx, holds.Settlement{RunID: ar.RunID, UserID: ar.UserID, AdmitToken: ar.Token,
			Source: holds.SourceAdmitLost})
		cancel()
		unreachable := holds.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded)
		if err == nil || !unreachable || !keepTrying || !time.Now().Before(until) {
			return res, err
		}
		log.Warn("lost admission not released yet; the database is out of reach, trying again", zap.Error(err))
		time.Sleep(lostReleasePause) // a try that failed fast must not spin
	}
}

// lostReleasePause spaces releaseLost's tries. A try normally lasts settle_timeout (the store
// retries an unreachable database inside it), so this only matters for one that fails at once.
const lostReleasePause = time.Second
