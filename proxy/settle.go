package proxy

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
	"go.uber.org/zap"
)

// finish settles a call. It runs after the handler, whatever ended it, and hands the work to
// a settlement that outlives the request: the client's cancellation must not cancel the
// charge for what it already used. A call that panicked is answered by answerPanic, and
// status set to what it was answered.
func (s *Server) finish(reqCtx context.Context, c *call, status *int) {
	if p := recover(); p != nil {
		c.outcome = outcomeAfterPanic(c)
		// The value as any quote of an upstream (an error may wrap its answer, key and all);
		// the line's stack trace is the panic's own, taken before recover's return unwinds it.
		c.log.Error("panic while serving; settling what was used", zap.String("panic", loggedPanic(c.req.upstream, p)), zap.Bool("forwarded", c.sent.Load()))
		if answerPanic(c) {
			*status = errPanicCharged.Status
		} else {
			// net/http closes the connection, and would log the value again, whole: the line
			// above is its one record.
			defer panic(http.ErrAbortHandler)
		}
	}
	c.ended = time.Now()
	// Unless its answer's end began it already.
	s.beginSettling(c)
	st := s.settlementOf(c)
	ctx := context.WithoutCancel(reqCtx)
	if records := slices.Concat(s.contextHandedOn(c, st), s.spokenAnswers(c, st), s.answerOwner(c)); len(records) > 0 {
		log := c.log
		s.settlements.start()
		s.inBackground(func() {
			defer s.settlements.leave()
			s.rememberTokens(ctx, records, log)
		})
	}
	if c.idem != nil {
		// Before the settlement: whoever finds this attempt settled must find its record final.
		s.finishIdem(ctx, c)
	}
	// What follows (tally, settlement, their retries) may outlive the request by up to
	// settle_timeout and needs neither the body (up to max_body_bytes) nor the copy of the
	// answer kept for a replay (up to max_replay_len): let them go now.
	c.req.body = nil
	if c.rw != nil {
		c.rw.buf = bytes.Buffer{}
	}
	if c.outcome == outcomeDuplicate {
		// Released in the request itself: when the caller reads its 409, the hold is gone.
		s.settlements.start()
		defer s.settlements.leave()
		tallied := s.tallyCall(ctx, c, st)
		if !s.settle(ctx, c, st) && !tallied {
			s.tallyDuplicateLater(ctx, c, st)
		}
		return
	}
	if c.inRun {
		s.finishRunCall(ctx, c, st)
		return
	}
	s.finishPlainCall(ctx, c, st)
}

// tallyDuplicateLater tries again, in the background until settle_timeout has passed, the zero
// tally of a duplicate whose release at 0 failed too (the database out of reach for longer
// than settle_timeout): the reconciler settles its hold from that tally once it expires, and a
// running hold without one is charged all it held — a request refused 409 that never reached
// the provider. Written once and given up in a moment's Redis outage, so it was. So too for a
// release that found its hold charged whole by a peer (settle reports it did not apply): a
// reconciler's pass refunds that charge from the zero tally should this process's refund fail.
func (s *Server) tallyDuplicateLater(ctx context.Context, c *call, st holds.Settlement) {
	s.settlements.start()
	s.inBackground(func() {
		defer s.settlements.leave()
		if !s.retryUntilSettleTimeout(ctx, func(ctx context.Context) bool { return s.tallyCall(ctx, c, st) }) {
			c.log.Error("zero tally of a duplicate whose release failed, or found its hold charged, never written until settle_timeout; the reconciler charges it its hold, or refunds none of that charge")
		}
	})
}

// errPanicCharged answers a call that panicked once the provider had its request, before
// anything of its answer was sent: it is charged the prompt's estimate (outcomeAfterPanic).
var errPanicCharged = &apiError{Status: http.StatusInternalServerError, Type: "api_error", Code: "internal_error",
	Message: "The gateway failed while serving this call, after the provider had it; it is charged its prompt's estimate.", NoRetry: true}

// answerPanic answers a call that panicked with errPanicCharged, and reports whether it did:
// when the call is charged (outcomeAfterPanic) and nothing of its answer was sent yet. Its
// connection closed instead, the OpenAI and Anthropic SDKs resend on a connection error, twice
// by default, and each resend that panics alike is charged again, for no answer. A call
// charged nothing keeps the closed connection (the SDK's retry costs nothing more), as does
// one whose answer began (a stream cut: never resent once its 200 came).
func answerPanic(c *call) bool {
	if !c.charged() || c.rw.status != 0 {
		return false
	}
	writeError(c.rw, errPanicCharged)
	return true
}

// outcomeAfterPanic is how a call that panicked is settled: as a stream that broke (the
// provider may have worked on it: its usage if reported, else the prompt's estimate), unless
// the provider never had the whole request and nothing had decided otherwise, as for a call
// refused before forwarding: then nothing was used, and the hold is released at 0.
func outcomeAfterPanic(c *call) outcome {
	if c.outcome == outcomeRefused && !c.sent.Load() {
		return outcomeRefused
	}
	return outcomeStreamError
}

// finishRunCall records the end of a named run's call: its tally (a complete answer's was
// written before its end reached the caller: tallyBeforeAnswer) and its row's record. The run
// stays open; it is settled on request or by the reconciler. A call that failed, even the
// run's first, leaves the run open: an agent retries with the same run id, and a run nobody
// comes back to is settled from its tally (at 0 when nothing was used) once it expires.
func (s *Server) finishRunCall(ctx context.Context, c *call, st holds.Settlement) {
	s.beforeStep(ctx, stepRunCallEnd)
	if !c.tallied {
		c.tallied = s.tallyCall(ctx, c, st)
	}
	if c.recordAs == nil {
		// One that failed before the answer's end is tried again in the
		// background below, not here, where the caller's connection waits for it.
		s.recordRunCall(ctx, c, st)
	}
	// The call is over; a run settled now must not find its lease (CloseRun refuses a leased
	// run).
	s.releaseLease(ctx, c)
	if !c.tallied || !c.recorded || c.recordMarkLeft {
		s.settlements.start()
		s.inBackground(func() {
			defer s.settlements.leave()
			s.retryRunCallEnd(ctx, c, st)
		})
	}
}

// finishPlainCall tallies and settles a call that is a run of its own.
func (s *Server) finishPlainCall(ctx context.Context, c *call, st holds.Settlement) {
	// Tally and settlement run after the caller has its answer; neither adds to its latency.
	// They go out together rather than one after the other: a settlement that reaches the
	// writer before the caller's next admission shares its transaction (holds.Writer), and
	// waiting first for the tally's round trip to Redis made it arrive after that admission
	// often enough to cost a commit and a lock wait per call. See tallyCall for why the order
	// does not matter to the reconciler.
	s.settlements.start()
	work := func() {
		// Done once the tally is written too: shutdown closes Redis when this is done.
		defer s.settlements.leave()
		if c.tallied && c.talliedAs != nil && talliedAsSettled(*c.talliedAs, st) {
			// With its fingerprint, before the answer's end (tallyWithFingerprint), as it is
			// settled.
			s.settle(ctx, c, st)
			return
		}
		// Its tally is not written, or says other than the settlement found (rare: usage an
		// upstream reported past its final event): the call's figures are set in it
		// beside the settlement, and tried again as a failed write is (tallyPlainCall). A
		// correction added once and given up left the reconciler, should the settlement fail
		// too, the final event's figures: a call charged 5 output tokens of the 50 reported
		// after it. settled closes only on a settlement that applied: one that found the run
		// charged its hold already (a pause past its life) leaves the tally what a reconciler's
		// revisit refunds from should this process's refund fail too.
		tallied, settled := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(tallied)
			s.tallyPlainCall(ctx, c, st, settled)
		}()
		if s.settle(ctx, c, st) {
			close(settled)
		}
		<-tallied
	}
	s.inBackground(work)
}

// talliedAsSettled reports whether a plain call's tally, written as tallied, already says
// what its settlement st charges: its figures, its estimated mark and its prices.
func talliedAsSettled(tallied, st holds.Settlement) bool {
	return tallied.Usage == st.Usage && tallied.CostMicro == st.CostMicro && tallied.Estimated == st.Estimated &&
		bytes.Equal(tallied.PriceSnapshot, st.PriceSnapshot)
}

// tallyPlainCall writes a plain call's tally (one that rode with its fingerprint and failed, or
// that says other than the settlement found, included: tallyWithFingerprint) and, while it
// fails, tries it again until the call's settlement has applied (settled is closed) or
// settle_timeout has passed. The tally is what the reconciler settles the run from when the
// settlement gives up (the database out of reach for longer than settle_timeout): written once
// and given up in a moment's Redis outage, the run was charged its hold (reconcile_hold), though
// Redis was back long before. It is what a reconciler's revisit refunds from too when the
// settlement found the hold charged whole by a peer (reconcile_hold) and the refund here failed
// (refundPausedCharge): tries stopped once that settlement committed left the final event's
// figures, refunded on as if the call had used no more.
func (s *Server) tallyPlainCall(ctx context.Context, c *call, st holds.Settlement, settled <-chan struct{}) {
	if s.tallyCall(ctx, c, st) {
		return
	}
	s.retryUntilSettleTimeout(ctx, func(ctx context.Context) bool {
		select {
		case <-settled:
			return true // moot: the settlement has the call
		default:
		}
		return s.tallyCall(ctx, c, st)
	})
	select {
	case <-settled:
	default:
		switch {
		case !c.tallyMissed:
		case c.talliedAs != nil:
			// The settlement is still trying, gave up, or found the hold charged: then this line, with its figures, is
			// the call's one record of what it used beyond its final event.
			c.log.Error("tally not set to what the settlement found until settle_timeout; a reconciler settling the run, or refunding the hold it charged, reads what its final event had",
				callFigures(st)...)
		default:
			// As above, of all it used.
			c.log.Error("tally never written until settle_timeout; a run the reconciler settles is charged its hold, and one it charged so is not refunded", callFigures(st)...)
		}
	}
}

// settle commits one settlement with its own deadline and retries, then drops the lease, and
// reports whether it applied: committed, on a hold still open. A settlement that gives up leaves
// the hold to expire and the reconciler to settle it from the tally; one that found the hold
// settled already (a peer's reconcile_hold, refundPausedCharge) leaves the tally what a
// reconciler's pass refunds from should that refund fail: either way the tally still matters.
func (s *Server) settle(ctx context.Context, c *call, st holds.Settlement) bool {
	// Last, once the lease is gone too: what finish began for this call.
	defer s.settling.end(c.user.ID)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
	defer cancel()
	// Settled or not, the call is over: without its lease, a run whose settlement failed is
	// the reconciler's once its hold expires.
	defer s.releaseLease(ctx, c)
	s.beforeStep(ctx, stepSettle)
	res, err := s.writer.Settle(ctx, st)
	if err != nil {
		s.metrics.SettleFailures.Inc()
		if errors.Is(err, holds.ErrSettleQueued) {
			c.log.Error("settlement still queued at settle_timeout; it commits once a batch takes it, or the reconciler settles this run", zap.Error(err))
		} else {
			c.log.Error("settlement failed; the reconciler will settle this run", zap.Error(err))
		}
		if !c.inRun && s.mayBeChargedUnderAPause(c) {
			// The reconciler settles only a run still open: one another process charged its
			// hold while this one was stopped is read again only by a pass's revisit, from its
			// call's tally, which may never have landed. Its refund is tried now, with a
			// deadline of its own.
			s.refundAfterFailedSettlement(ctx, c, st)
		}
		return false
	}
	s.metrics.SettleSeconds.Observe(time.Since(c.ended).Seconds())
	s.metrics.Settlements.WithLabelValues(st.Source, strconv.FormatBool(res.Applied)).Inc()
	c.log.Debug("settled", zap.String("source", st.Source), zap.Bool("applied", res.Applied),
		zap.Int64("charged_micro", res.ChargedMicro), zap.Bool("estimated", st.Estimated))
	if !res.Applied && !c.inRun {
		s.refundPausedCharge(ctx, c, st)
	}
	return res.Applied
}

// refundPausedCharge gives back, by a grant keyed by its run, what another process charged the
// hold of c, a run of one call, beyond what c's own settlement st, which found the hold settled
// already, would have charged. That happens when c's process was stopped (SIGSTOP, a VM's live
// migration) between the hold's COMMIT and the forward for longer than the hold lives, or than
// holds.dead_instance_after: a peer's reconciler took the unleased, untallied hold for a killed
// process's and charged what it held (reconcile_hold, DESIGN §5 rule 3). Resumed, the call was
// either not forwarded after all (its caller had left, a newer message of its session replaced
// it, a duplicate was running: released at 0, it used nothing) or forwarded as the call it had
// paid for (paidUnderAPause: settled at what it used, 200 µUSD against a hold of 20 000). The
// first settlement stands (exactly once), so the whole hold stayed charged, and a call never
// made was paid for again by its caller's retry. This process alone knows what the call used:
// the grant gives back the difference, so the user is charged what the call used, as its own
// settlement would have charged it. A call that used more than the hold was charged keeps that
// charge (its hold, which capped it): nothing more is taken, the rest logged as uncharged. So
// it goes for a call forwarded before its process was stopped, or whose lease lapsed, past its
// hold: the reconciler charged the hold of a call it took for dead, which then ended and knew
// what it used.
//
// One grant per run, whichever process and however often it is sent: its key is the run's
// (pauseRefundKey), and a grant's key, unique, pays once; one of another amount under the same
// key is refused (holds.ErrGrantKeyReused). A reconciler's pass sends it too, from the call's
// tally, once no live process serves the run (holds.Reconciler's refundPaused): the refund of a
// process killed before its grant is not lost, and with the tally's figures the same as st's,
// whichever comes second is a replay. A run of one call has one settlement by its process,
// so the refund of a call never forwarded and that of one forwarded cannot both be paid. Only
// reconcile_hold is given back: a charge from a tally is of calls that were made, and a named
// run's hold is its calls' (c is not all of it).
//
// It has a settle_timeout of its own: on the settlement's, the one that found the hold settled
// after a database stall had spent most of it, the refund was lost, an error line its only trace.
func (s *Server) refundPausedCharge(ctx context.Context, c *call, st holds.Settlement) {
	s.beforeStep(ctx, stepRefund)
	s.refundPausedHold(ctx, c.user.ID, c.runID, "", st, c.log.Named(holds.MoneyLog),
		"hold of a call found settled by another process, and its run not read; the reconciler refunds a reconcile_hold charge within holds.tally_ttl from the call's tally: with none, refund by grant what the call did not use")
}

// refundPausedHold is refundPausedCharge's work on userID's run runID, whose hold a settlement
// st of this process found settled: the grant of what a peer's reconcile_hold charged beyond
// what st would have charged. token, when set, is the admission's whose hold st settles (a
// release by token): a hold another admission inserted on the run is not this process's to
// refund. log is the money log; unread its line of a run that could not be read.
func (s *Server) refundPausedHold(ctx context.Context, userID uint64, runID, token string, st holds.Settlement, log *zap.Logger, unread string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Limits.SettleTimeout)
	defer cancel()
	run, err := s.store.Run(ctx, userID, runID)
	if errors.Is(err, holds.ErrRunNotFound) {
		return // never inserted (a lost admission's COMMIT that did not land): nothing charged
	}
	if err != nil {
		log.Error(unread, append(callFigures(st), zap.Error(err))...)
		return
	}
	if run.State != holds.StateSettled || run.SettleSource.String != holds.SourceReconcileHold || run.ChargedMicro <= 0 ||
		(token != "" && run.AdmitToken.String != token) {
		return
	}
	refund, uncharged := pauseRefund(run, st)
	if refund == 0 {
		if uncharged > 0 {
			log.Warn("hold charged (reconcile_hold) by another process before this call settled; the call used more than that charge, which stands",
				zap.Int64("charged_micro", run.ChargedMicro), zap.Int64("uncharged_micro", uncharged), zap.String("source", st.Source))
		}
		return
	}
	// The reason says whether the call answered anything: a retry of its Idempotency-Key,
	// once Redis lost the key's record, reads it (attemptPinned). The amount cannot say so: a
	// call answered at no cost (a discount of 10 000 bp) is given back whole too.
	reason := usedRefundReason
	switch st.Source {
	case holds.SourceRelease, holds.SourceDuplicate:
		reason = unforwardedRefundReason
	case holds.SourceUpstreamError:
		reason = upstreamRefusedRefundReason
	}
	g, created, err := s.store.Grant(ctx, holds.GrantRequest{UserID: userID, AmountMicro: refund,
		IdempotencyKey: pauseRefundKey(runID), Reason: reason})
	if errors.Is(err, holds.ErrGrantKeyReused) {
		// A reconciler's pass refunded first, from a tally that said other than st (its final
		// event's figures, set right since): its grant stands, what differs is logged.
		log.Error("hold charged (reconcile_hold) by another process before this call settled; refunded already at other figures (a reconciler's pass, from the call's tally), which stand",
			zap.Int64("charged_micro", run.ChargedMicro), zap.Int64("refund_micro", refund), zap.String("grant_key", pauseRefundKey(runID)), zap.Error(err))
		return
	}
	if err != nil {
		log.Error("hold charged (reconcile_hold) by another process before this call settled; the refund of what the call did not use failed: refund by grant",
			zap.Int64("charged_micro", run.ChargedMicro), zap.Int64("refund_micro", refund), zap.String("grant_key", pauseRefundKey(runID)), zap.Error(err))
		return
	}
	log.Warn("hold charged (reconcile_hold) by another process before this call settled; what the call did not use given back by grant",
		zap.Int64("charged_micro", run.ChargedMicro), zap.Int64("refund_micro", refund), zap.String("source", st.Source),
		zap.Uint64("grant_id", g.ID), zap.Bool("created", created))
}

// refundAfterFailedSettlement is refundPausedCharge for a call whose own settlement failed
// (the database out of reach for all its settle_timeout, say, once its process resumed): the
// run was left to the reconciler, which settles a run still open from the call's tally but
// reads one settled again only in a pass's revisit (holds' refundPaused), from that tally: a
// hold a peer's reconciler charged (reconcile_hold) while this process was stopped keeps its
// whole charge until a pass reads the tally, and for good if the tally never landed. The run
// is read again: a hold still open, or one this settlement committed after all (its reply
// lost), is no refund's; a run that cannot be read leaves its money line with the call's
// figures.
func (s *Server) refundAfterFailedSettlement(ctx context.Context, c *call, st holds.Settlement) {
	s.beforeStep(ctx, stepRefund)
	s.refundPausedHold(ctx, c.user.ID, c.runID, "", st, c.log.Named(holds.MoneyLog),
		"settlement failed on a call its process may have been stopped past its hold, and its run not read; if another process charged the run its hold (reconcile_hold), refund by grant what the call did not use")
}

// mayBeChargedUnderAPause reports whether another process may have charged the hold of c by
// now, taking it for a killed process's: c was paid under a pause (paidUnderAPause), or has
// lived since its arrival as long as the soonest such a charge can come (soonestChargedByPeer).
// Only such a call reads its run again after a failed settlement: the settlements that fail in
// an outage add no read to their slot's time.
func (s *Server) mayBeChargedUnderAPause(c *call) bool {
	return c.paidUnderPause || time.Since(c.arrived) >= s.soonestChargedByPeer(c.inRun)
}

// soonestChargedByPeer is how long after a call's arrival another process may settle its
// unleased hold: at its expiry (a named run's, inRun, is pushed out by run_ttl at each
// admission, and no dead process's sweep brings it in), or once this process is declared dead:
// its last beat dead_instance_after old, and that beat may be up to its gap older than the
// hold (holds.BeatGap; 65 s under the defaults, not 90).
func (s *Server) soonestChargedByPeer(inRun bool) time.Duration {
	if inRun {
		return s.cfg.Holds.RunTTL
	}
	return min(s.cfg.Holds.HoldTTL, s.cfg.Holds.DeadInstanceBound()-holds.BeatGap(s.cfg.Holds.HeartbeatInterval))
}

// pauseRefund is what of run's charge a call's own settlement st, had it found the hold open,
// would not have charged (refund), and what it would have charged beyond it (uncharged: the
// call used more than its hold, whose charge stands; nothing more is taken): holds.PauseRefund,
// the arithmetic a reconciler's pass that reads the call's tally uses too, so both send one
// amount under one key.
func pauseRefund(run holds.Run, st holds.Settlement) (refund, uncharged int64) {
	return holds.PauseRefund(run, st.CostMicro, st.ChargeHeld)
}

// pauseRefundKey is the idempotency key of the grant that gives back what runID's hold was
// charged beyond what its call used (refundPausedCharge): one refund per run, whichever process
// and however often it is sent — a reconciler's pass included (holds.PauseRefundKey) — and
// whether or not the call was forwarded.
func pauseRefundKey(runID string) string { return holds.PauseRefundKey(runID) }

// The refund's reasons, as the operator's listing of grants shows them.
const (
	unforwardedRefundReason     = holds.UnforwardedRefundReason
	upstreamRefusedRefundReason = holds.UpstreamRefusedRefundReason
	usedRefundReason            = "refund: hold charged (reconcile_hold) before its call settled; the call used less (or nothing: answered at no cost)"
)

// failedBeforeWork reports whether the provider said an answer failed (an error event after
// its 200, an error object) before it produced anything and without a usage: settled at 0 as a
// refusal with a non-2xx status is (settlementAs).
func failedBeforeWork(res metering.Result) bool {
	return res.UpstreamError && (!res.Reported || res.StartOnly) && !res.Produced()
}

// charged reports whether the call, ended as c.outcome says, is charged for what the provider
// did — its usage, or an estimate of it — rather than released or settled at 0: what
// settlementAs decides, read before the answer goes out (writeCallError).
func (c *call) charged() bool {
	switch c.outcome {
	case outcomeRefused, outcomeDuplicate, outcomeUpstreamError:
		return false
	case outcomeStreamError:
		return !failedBeforeWork(c.meter.Result())
	default:
		return true
	}
}

// settlementOf turns how a call ended into what it is charged.
func (s *Server) settlementOf(c *call) holds.Settlement { return s.settlementAs(c, c.outcome) }

// settlementAs is what the call would be charged, were it to end as o.
func (s *Server) settlementAs(c *call, o outcome) holds.Settlement {
	st := holds.Settlement{RunID: c.runID, UserID: c.user.ID, Model: c.req.model, Calls: 1, PriceSnapshot: s.snapshots[c.req.priceKey]}
	switch o {
	case outcomeRefused:
		st.Source, st.Calls = holds.SourceRelease, 0
		return st
	case outcomeDuplicate:
		st.Source, st.Calls = holds.SourceDuplicate, 0
		return st
	case outcomeUpstreamError:
		st.Source = holds.SourceUpstreamError
		return st
	case outcomeCancel:
		st.Source = holds.SourceCancel
		if s.shuttingDown.Load() {
			st.Source = holds.SourceShutdown
		}
	case outcomeStreamError:
		st.Source = holds.SourceStreamError
		if failedBeforeWork(c.meter.Result()) {
			// The provider said it failed (an error event after its 200) before it produced
			// anything and without a usage (Anthropic's message_start counts the prompt before
			// any work, and Anthropic bills no failed request): as for a refusal with a non-2xx
			// status, nothing was used. (A stream that only broke, with no word from the provider, keeps the
			// prompt's estimate: the provider may have worked on it, as after a timeout.)
			st.Source = holds.SourceUpstreamError
			return st
		}
	case outcomeUpstreamTimeout:
		st.Source = holds.SourceUpstreamTimeout
	default:
		st.Source = holds.SourceComplete
	}
	res := c.meter.Result()
	if res.Reported {
		st.Usage, st.Estimated = res.Usage, res.Estimated
		if res.PromptMissing {
			// A report of the output alone: the prompt is its estimate, less what the report
			// says was read from or written to the cache. At 0 it went unbilled.
			est := c.req.promptEstimate()
			st.Usage.Input = max(0, est.Input-st.Usage.CacheRead-st.Usage.CacheWrite)
			st.Usage.AudioInput = min(est.AudioInput, st.Usage.Input)
			st.Estimated = true
		}
		if c.req.cacheLong && c.req.route.format != metering.FormatAnthropic && !res.CacheWriteSplit {
			// The OpenAI-shaped usage reports the cache writes' total only
			// (prompt_tokens_details.cache_write_tokens, OpenRouter's; an older LiteLLM's
			// cache_creation_input_tokens), not which were the
			// one-hour ones a router serving Claude asked for: all are billed at the one-hour
			// price, never less than the provider charged. Here, so that the tally, and the
			// reconciler settling from it, carry them so too.
			st.Usage.CacheWrite1h = st.Usage.CacheWrite
		}
		if c.req.cacheLong && c.req.route.format == metering.FormatAnthropic {
			// Anthropic's message_delta may count more writes than message_start did (a server
			// tool's later turns) without saying of which ttl, and an Anthropic-compatible
			// server may not break them down at all: the writes no report says were
			// five-minute ones are billed at the one-hour price the call asked for, never less
			// than the provider charged.
			st.Usage.CacheWrite1h = max(st.Usage.CacheWrite1h, st.Usage.CacheWrite-res.CacheWrite5m)
		}
	} else {
		st.Usage = c.req.promptEstimate()
		st.Usage.Output, st.Usage.AudioOutput = res.EstimatedOutput()
		st.Estimated = true
	}
	price, priceKey := c.req.price, c.req.priceKey
	answered := res.Model
	if res.ModelAsked && c.req.fallbacks {
		// A Responses stream cut before its final event named only the model asked for
		// (response.created): no word of which of the call's fallbacks answered. Taken for
		// the answer's, it billed a fallback's work at the price asked for.
		answered = ""
	}
	p, key, ok, unpriced := s.answeredPrice(c, answered)
	if (answered == "" || unpriced) && c.req.fallbacks {
		// No word of which model answered (a timeout or a break before the answer named it,
		// an answer that names none, or one without a price) on a call a router may have
		// answered with any of its fallbacks, the one asked for having failed when it does:
		// billed at the price asked for, a prompt a fallback eight times dearer worked on paid
		// an eighth. The dearest of them bills it, as its output bound was reckoned; the
		// snapshot is that price.
		price = c.req.fallbackPrice
		st.PriceSnapshot = price.Snapshot(priceKey)
	}
	if ok {
		price, priceKey, st.PriceSnapshot = p, key, s.snapshots[key]
		if lacksPartPrice(p, st.Usage, c.req.context1M) {
			// The call asked for work the answering model has no price of its own for (a
			// snapshot priced apart without the block or the audio prices): billed at its text,
			// short or five-minute rates, such a call paid a fraction of the provider's. The
			// price asked for has them (unpricedOption): the dearer of the two bills it, never
			// below either.
			price = p.Dearest(c.req.price)
			st.PriceSnapshot = price.Snapshot(key)
		}
	}
	if (!res.Reported || res.PromptMissing) && c.req.cacheMarked {
		// No word of what the provider did with a prompt marked for its cache (an Anthropic
		// stream cut before message_start, its prompt estimated): it bills what it writes there at the cache-write
		// price, up to 2× the input price, as the output bound reckoned. The row's snapshot is
		// the price so used, so that its tokens still explain its cost.
		price = c.req.promptPrice(price)
		st.PriceSnapshot = price.Snapshot(priceKey)
	}
	st.CostMicro = price.Cost(st.Usage)
	return st
}

// lacksPartPrice reports whether p, an answering model's price, has no price of its own for
// work u was billed for — audio in or out, one-hour cache writes — or, with the context-1m beta
// (long), for long-context rates: Cost would bill that work at its whole's price (text,
// output, five-minute writes) or its short rates, well below what the provider charges for it.
func lacksPartPrice(p pricing.Price, u pricing.Usage, long bool) bool {
	u = u.Clamp()
	return (long && p.Long == nil) || (u.AudioInput > 0 && p.AudioInput == 0) ||
		(u.AudioOutput > 0 && p.AudioOutput == 0) || (u.CacheWrite1h > 0 && p.CacheWrite1h == 0)
}

// answeredPrice is the price of the model the upstream says answered, when that is priced
// under another configured name than the model asked for: the call is billed for what ran
// (an alias answered by a dearer snapshot, a router that picked another model). An answer
// naming no model, the same one, or one without a price (unpriced, and logged: the operator
// has a model to price) is not (ok false): settlementAs bills it at the price asked for, or at
// the dearest fallback's on a call that names fallbacks.
func (s *Server) answeredPrice(c *call, answered string) (p pricing.Price, key string, ok, unpriced bool) {
	if answered == "" || answered == c.req.model {
		return pricing.Price{}, "", false, false
	}
	p, key, err := s.prices.Lookup(answered)
	if err != nil {
		c.log.Warn("the model that answered has no price; billed at the price asked for, or the dearest fallback's",
			zap.String("asked", c.req.model), zap.String("answered", loggedUpstream(c.req.upstream, answered)), zap.Bool("fallbacks", c.req.fallbacks))
		return pricing.Price{}, "", false, true
	}
	if key == c.req.priceKey {
		return pricing.Price{}, "", false, false
	}
	c.log.Info("billed at the price of the model that answered", zap.String("asked", c.req.model),
		zap.String("answered", loggedUpstream(c.req.upstream, answered)), zap.String("priced_as", key))
	return p, key, true, false
}

// wholeOutcome is how a call whose answer is whole ends: complete, unless the upstream reported
// an error in it.
func (c *call) wholeOutcome() outcome {
	if c.meter.Result().UpstreamError {
		return outcomeStreamError
	}
	return outcomeComplete
}

// answerFinal is called when a call's answer is whole and its end about to reach the caller:
// what the call claimed against duplicates is given back (its fingerprint; its session's
// "running" mark), so the same request sent the moment the answer ends is a new one, not a
// duplicate of a call whose settlement is still on its way. Each step is safe to repeat; the
// handler's defers repeat them for calls that end otherwise.
func (s *Server) answerFinal(ctx context.Context, c *call) {
	s.beginSettling(c)
	s.endFingerprint(ctx, c)
	s.endSessionCall(ctx, c)
	s.beforeStep(ctx, stepAnswerFinal)
}

// beginSettling counts c, once, among its user's calls settling (settlingUsers) when it is
// settled as a call of its own (a duplicate, or no named run's call): its answer is over, and
// until its settlement is back (settle ends this), an admission of its user refused for want of
// a slot waits for it. answerFinal begins it before the answer's end goes out, finish for a call
// that ended otherwise: begun only when the handler ended, a stream's call whose upstream had
// not closed at its final event (finalGrace) was not counted, and its caller's next call, sent
// on the final event, was refused 429 at once for the slot of a call whose answer it had.
func (s *Server) beginSettling(c *call) {
	if c.settling || (c.inRun && c.outcome != outcomeDuplicate) {
		return
	}
	c.settling = true
	s.settling.begin(c.user.ID)
}

// releaseLease gives back the lease the call took, if it took one. It has its own deadline:
// the caller's may have run out (a settlement that gave up).
func (s *Server) releaseLease(ctx context.Context, c *call) {
	if !c.leased {
		return
	}
	c.leased = false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseReleaseTimeout)
	defer cancel()
	if err := s.leases.Release(ctx, c.runID); err != nil {
		c.log.Warn("lease not released; it lapses on its own", zap.Error(err))
	}
}

// leaseReleaseTimeout bounds deleting a lease key; one that is not deleted lapses after the
// lease TTL, since this process no longer refreshes it.
const leaseReleaseTimeout = 2 * time.Second

// inBackground runs fn beside the request when one of settleSlots is free, else in the
// request: backpressure, so that settlements (and what they hold) behind a slow database or
// Redis cannot grow without bound — past the slots, each caller waits for its own.
func (s *Server) inBackground(fn func()) {
	if !s.tryBackground(fn) {
		fn()
	}
}

// tryBackground runs fn beside the request in one of settleSlots and reports true, or reports
// false, without running it, when none is free.
func (s *Server) tryBackground(fn func()) bool {
	select {
	case s.settleSlots <- struct{}{}:
		go func() {
			defer func() { <-s.settleSlots }()
			fn()
		}()
		return true
	default:
		return false
	}
}
