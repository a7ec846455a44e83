package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// outcome is how a forwarded call ended; it decides how the call is settled.
type outcome int

const (
	outcomeRefused         outcome = iota // held, then refused before forwarding: release at 0
	outcomeUpstreamError                  // the upstream failed before producing anything: settle at 0
	outcomeComplete                       // the upstream finished
	outcomeStreamError                    // the upstream broke or reported an error after producing output
	outcomeCancel                         // the client went away
	outcomeUpstreamTimeout                // the upstream took the request and did not answer in time
	outcomeDuplicate                      // held, then found to duplicate a running request: release at 0, now
)

// call is one model request from admission to settlement.
type call struct {
	req     *callRequest
	user    holds.User
	hold    holds.Hold
	runID   string
	log     *zap.Logger
	meter   *metering.Meter
	outcome outcome
	// inRun marks a call of a caller-named run: it tallies but does not settle; the run settles
	// on POST /v1/runs/{id}/settle or by reconciliation.
	inRun bool
	// paidUnderPause: another process charged this call's hold while its process was stopped
	// before the forward (paidUnderAPause); it is forwarded, whatever its admission budget says.
	paidUnderPause bool
	// overtakenBy: this Idempotency-Key attempt, its hold charged while its process was stopped
	// before the forward, found its key moved on to this later attempt's run (paidUnderAPause):
	// a retry ran the key meanwhile, and this attempt is answered as a duplicate, not forwarded.
	overtakenBy string
	// unclaimed: this Idempotency-Key attempt, paid under a pause, could not mark its key's
	// record as being forwarded (claimForward, Redis out of reach): not forwarded, as a retry
	// could then run the key beside it; answered 503 dedup_unavailable, its charge given back.
	unclaimed error
	// reserving: this call of a named run reserved (or tried to reserve) part of the run's
	// budget under callID (reserveRunBudget); its tally gives it back.
	reserving bool
	// callID is a named run's call's own id: its reservation's and its record's.
	callID string
	// tallied: the call's tally has landed and must not be written again. One that failed is
	// tried again until settle_timeout: a named run's call's by retryRunCallEnd (each step
	// safe to repeat), a plain call's beside its settlement (tallyPlainCall), its figures set,
	// not added (runstate.Tally.RecordCallWith), as a write that failed may have landed
	// unanswered, or land late.
	tallied bool
	// talliedAs is what tallyWithFingerprint wrote, nil if the write failed (it may or may not
	// have landed): a settlement that finds more (usage reported after a stream's final event)
	// sets the call's tally again, as a failed write is (finishPlainCall).
	talliedAs *holds.Settlement
	// tallyWrites counts a plain call's tally writes sent (tallyWithFingerprint, tallyCall):
	// each carries the next number, so that one that reaches Redis late, after a later one,
	// does not overwrite it (runstate.Tally.RecordCallWith). Written by one goroutine at a
	// time: the relay's, then finishPlainCall's tally.
	tallyWrites int64
	// recorded: this call of a named run has been recorded on its run's row (recordRunCall).
	// A record that failed leaves it false, to be sent again (retryRunCallEnd): the row counts
	// a call once however often its record is sent.
	recorded bool
	// recordAs: a record of this call failed, and was logged; it is sent again with these
	// figures (recordRunCall), in the background alone (finishRunCall), and a later try that
	// lands says so.
	recordAs *holds.Settlement
	// recordMarked: its tally marked the call's record as still to come (a run whose Redis
	// record lost calls: runstate.RunBudget.ReleaseBeforeRecord), which recordRunCall drops.
	recordMarked bool
	// recordMarkUnknown: that tally failed, and may have landed with the mark (its reply
	// lost): the tally's later try, once the call is recorded, drops it (tallyCall).
	recordMarkUnknown bool
	// recordMarkLeft: recordRunCall's drop of the mark failed; the call's end tries it again
	// (retryRunCallEnd).
	recordMarkLeft bool
	// tallyMissed: a tally write of this call failed and was logged; a later try that lands
	// says so (tallyCall), or the log misleads.
	tallyMissed bool
	// recordFailed: its record on its run's row never landed, tried until settle_timeout
	// (retryRunCallEnd): a tally that never lands may then leave the call out of its run's
	// charge.
	recordFailed bool
	// leased: this call holds a lease on its run (taken just before forwarding), which it must
	// give back however it ends, or the heartbeat keeps the run alive and the reconciler never
	// settles it.
	leased bool
	// settling: the call is counted among its user's calls settling (Server.beginSettling),
	// which its settlement ends.
	settling bool
	held     time.Time // when its hold was granted
	// sent: the upstream has had the whole request (its last write succeeded; the transport
	// says so, sendUpstream), which decides what a call that fails before its answer costs.
	sent  atomic.Bool
	ended time.Time
	// idem is set for an Idempotency-Key request; rw then keeps what the caller was sent. rw
	// says, for every call, whether anything of its answer was sent (finish's answer to a panic).
	idem *idemCall
	rw   *respWriter
	// idemPinned: the idempotency record holds this attempt's answer (pinBeforeAnswer).
	idemPinned bool
	// idemOnRow: the attempt's row records its pinning call, as Redis refused its answer
	// (recordAnsweredAttempt).
	idemOnRow bool
	// idemCounted: the bytes of this attempt's answer counted against its caller's share of
	// kept answers (replayRoom); an answer stored again (pinned at the provider's error event,
	// then at the final event after it) counts only what it grew by.
	idemCounted int64
	// fpKey is the fingerprint this plain call registered (dedup window); it is given back
	// (endFingerprint) before the end of the call's answer reaches the caller.
	fpKey string
	// sessionClaimed: this call is its session's current run; endSessionCall marks its end.
	sessionClaimed bool
	// superseded: a newer message of its session stopped this call.
	superseded bool
	// sessionFrom: its session's current run before its admission waited (admitFitting); its
	// claim does not take the session from a newer message that claimed it since.
	sessionFrom sessionFrom
	// arrived: when its request arrived (its body read whole), which orders its session's
	// messages on this process (Server.sessionArrivals).
	arrived time.Time
}

// RunIDHeader carries the run id of every answered model call, so a caller can look its run up.
const RunIDHeader = "X-Tollgate-Run-Id"

// RequestIDHeader names every model call's request, refused or answered, as the request_id of
// each of its log lines. It is the call's own run id when the call makes one (neither a named
// run nor an Idempotency-Key's), and no run at all when the call was refused.
const RequestIDHeader = "X-Tollgate-Request-Id"

// serveCall handles one model route: validate, admit, rewrite, forward, and settle in a
// deferred path that runs however the request ends.
func (s *Server) serveCall(rt *route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		user := userFrom(r.Context())
		runID := newRunID()
		// The first run id names the request too: a refused caller has no run to quote, and
		// an operator asked about a refusal finds its log line by the id this header gave.
		w.Header().Set(RequestIDHeader, runID)
		// Lazy: most calls log nothing, and encoding the fields up front was 2 % of the
		// gateway's CPU under load.
		callLog := s.log.WithLazy(append([]zap.Field{zap.Uint64("user_id", user.ID), zap.String("route", rt.path),
			zap.String("request_id", runID)}, askedRunField(r.Header)...)...)
		if !s.calls.enter() {
			e := errShuttingDown
			ids, idsErr := parseCallIDs(r.Header)
			logRefusal(callLog, e, "shutting down", nil, zap.String("run_id", callRunID(user.ID, runID, ids, idsErr)))
			writeError(w, e)
			s.metrics.Requests.WithLabelValues(rt.path, codeLabel(e.Status)).Inc()
			return
		}
		defer s.calls.leave()
		r, uncut := s.cuttable(r)
		defer uncut()
		status := http.StatusInternalServerError
		// Counted as it returns or panics: a call whose handler panicked (its connection closed
		// by net/http, or its stream cut) is a failure of the gateway's, and counted nowhere it
		// showed as a call fewer rather than as a 500.
		defer func() { s.metrics.Requests.WithLabelValues(rt.path, codeLabel(status)).Inc() }()
		status = s.handleCall(w, r, rt, user, runID, callLog)
	}
}

// handleCall serves one call; callLog is the logger of the request, without a run id: the
// call's run id may change (a named run, an Idempotency-Key's), and a line must name one run.
func (s *Server) handleCall(w http.ResponseWriter, r *http.Request, rt *route, user holds.User, runID string, callLog *zap.Logger) (status int) {
	// The body stays in memory, and counted, until the call is over (see bodyMemory).
	body := s.bodies.lease(user.ID)
	defer body.release()
	in, refused := s.readCall(w, r, rt, user.ID, runID, body, callLog)
	if refused != 0 {
		return refused
	}
	// The key was looked up as the headers arrived; a key revoked while the body came in is
	// refused here, before anything is held (keyStillLive).
	if e, reason, err := s.keyStillLive(r, user); e != nil {
		if requestEnded(r) {
			e, why := ended(r.Context(), "during the key's lookup after the body; nothing held")
			logRefusal(in.log, e, why, err)
			return answerClientClosed(w, r)
		}
		return refuser(w, in.log)(e, reason, err)
	}
	// The steps before forwarding share one admit_timeout, counted from the body read whole
	// (in.deadline): each had its own (an admission, an Idempotency-Key attempt's row, the next
	// attempt's admission, a session's claim...), and a caller waited several before it was
	// forwarded or refused.
	actx, cancel := admissionContext(r.Context(), in.deadline)
	defer cancel()
	c, answered := s.admitCall(w, r, actx, rt, user, runID, in, callLog)
	if c == nil {
		return answered
	}
	w = c.rw
	defer s.sessionArrivals.Delete(c.runID) // after the settlement below: deferred first
	// From here on the hold exists, and this deferred settlement is what closes it: it runs on
	// success, error, client cancel and panic alike (and may answer a panic: status).
	defer s.finish(r.Context(), c, &status)
	return s.runCall(w, r, actx, c, in)
}

// refuser is how a call's steps refuse it: the refusal's line goes to log, its answer to w,
// and its status is returned.
func refuser(w http.ResponseWriter, log *zap.Logger) func(e *apiError, reason string, err error) int {
	return func(e *apiError, reason string, err error) int {
		logRefusal(log, e, reason, err)
		writeError(w, e)
		return e.Status
	}
}

// admitCall holds credits for a call read whole (in), under its run id: a caller-named run's,
// an Idempotency-Key attempt's, else runID, made up for this request. It returns the call, or
// nil and the status of the answer written instead (a refusal, a replay, a duplicate), with
// nothing held that needs undoing. Its steps run under actx, the call's admission budget.
func (s *Server) admitCall(w http.ResponseWriter, r *http.Request, actx context.Context, rt *route, user holds.User, runID string,
	in incomingCall, callLog *zap.Logger) (*call, int) {
	req, clientRunID, idemKey, sessionID := in.req, in.ids.clientRunID, in.ids.idemKey, in.ids.sessionID
	// A caller-named run groups many calls under one hold; without a name a call is a run of
	// one that settles when it ends.
	ttl := s.cfg.Holds.HoldTTL
	if clientRunID != "" {
		runID, ttl = runIDFor(user.ID, clientRunID), s.cfg.Holds.RunTTL
	}
	log := callLog.WithLazy(zap.String("run_id", runID))
	ar := holds.AdmitRequest{
		RunID: runID, UserID: user.ID, ClientRunID: clientRunID, SessionID: sessionID, Model: req.model,
		State: holds.StateRunning, TTL: ttl, UserTurns: req.userTurns,
		// A run id made up here at random cannot have been admitted before.
		Fresh: clientRunID == "" && idemKey == "",
		Token: newAdmitToken(),
		// The prices this process bills the run's calls at: kept on the hold for whoever
		// settles it, perhaps a process with a newer price table.
		PriceSnapshot: s.snapshots[req.priceKey],
	}
	var (
		hold holds.Hold
		idem *idemCall
		err  error
		from sessionFrom
	)
	if idemKey != "" {
		idem = &idemCall{key: idemKey, userID: user.ID, bodyHash: in.bodyHash, body: in.body, lease: in.lease}
		idem.record = s.keys.Replay(idempotentRunID(user.ID, idemKey, 0))
		var answered int
		hold, answered = s.admitIdempotent(w, r, actx, idem, &ar, callLog)
		idem.body = nil // the call keeps its record's name, not its body, until it settles
		if answered != 0 {
			return nil, answered
		}
		runID = ar.RunID
		log = callLog.WithLazy(zap.String("run_id", runID))
	} else {
		hold, err = s.admitFitting(actx, r.Context(), &ar, fitsPrompt(req, s.cfg.Models[req.priceKey]), callLog, &from)
		if ar.RunID != runID {
			// Admitted again after a hold too small for the prompt (admitFitting): what follows,
			// a refusal of that admission too, is of the run it last tried.
			runID = ar.RunID
			log = callLog.WithLazy(zap.String("run_id", runID))
		}
		if err != nil {
			s.releaseLostAdmission(r.Context(), ar, err, log)
			if r.Context().Err() != nil {
				e, why := ended(r.Context(), "during admission; nothing held")
				logRefusal(log, e, why, err)
				return nil, answerClientClosed(w, r)
			}
			e := s.admitError(err)
			logRefusal(log, e, "admission", err)
			writeError(w, e)
			return nil, e.Status
		}
	}

	c := &call{req: req, user: user, hold: hold, runID: runID, log: log, meter: metering.NewMeter(rt.format),
		inRun: clientRunID != "", idem: idem, held: time.Now(), sessionFrom: from, arrived: in.arrived}
	if req.echoPrompts != nil {
		c.meter.EchoPrompts(req.echoPrompts, req.echoPer)
	}
	if req.batchPrompts != nil {
		c.meter.BatchPrompts(req.batchPrompts, req.batchPer)
	}
	if c.inRun {
		// Its budget reservation and its record on the run's row name it by this, so a record
		// sent again is counted once (holds.Store.RecordRunCall).
		c.callID = token.New()
	}
	s.metrics.admitPhase.Observe(c.held.Sub(in.arrived).Seconds())
	c.rw = &respWriter{ResponseWriter: w, capture: idem != nil, limit: s.cfg.Dedup.MaxReplayLen}
	return c, 0
}

// fitBudget bounds what the call may spend and rewrites its request to fit: the cap bounds
// what is charged, and at a discount a call may cost more than that at list price, which is
// what the rewrite and the run's budget count in. A named run's call reserves its part of the
// run's budget first (a named run has no session nor fingerprint: its reservation keeps its
// place, right after the hold). Checked before a session claims the call: a message refused
// for its cost must not stop the session's running one. A refusal is written (refuse), its
// status returned, and the hold is released at 0.
func (s *Server) fitBudget(ctx context.Context, c *call, refuse func(*apiError, string, error) int) int {
	budget := pricing.MaxCostWithin(c.hold.CapMicro, c.hold.DiscountBP)
	exhausted := errPromptOverCap
	if c.inRun {
		granted, e, err := s.reserveRunBudget(ctx, c, budget)
		if e != nil {
			c.outcome = outcomeRefused
			return refuse(e, "run budget", err)
		}
		budget, exhausted = granted, errRunBudget
	}
	ok, err := c.req.rewrite(budget, s.cfg.Models[c.req.priceKey])
	if err != nil {
		c.outcome = outcomeRefused
		return refuse(errBuildUpstream, "rewrite", err)
	}
	if !ok {
		c.outcome = outcomeRefused
		return refuse(exhausted, "budget below the cost of the prompt", nil)
	}
	return 0
}

// fitsPrompt reports whether a hold pays for req's prompt and least answer: whether fitBudget
// would forward a plain call under it. A cap that leaves room for more than any route's least
// answer (an extended-thinking call's, 1 025 tokens) plainly does; else the rewrite is tried on
// a copy, as it edits the body. (Asked of every call admitted while its user's calls settle,
// a trial rewrite each time would copy the body once more for nothing.)
func fitsPrompt(req *callRequest, model config.ModelCfg) func(holds.Hold) bool {
	return func(h holds.Hold) bool {
		budget := pricing.MaxCostWithin(h.CapMicro, h.DiscountBP)
		if len(req.route.maxFields) > 0 {
			if limit := req.boundPrice().MaxOutputWithin(req.promptEstimate(), budget); limit >= 0 &&
				limit/req.choices > max(minThinkingBudget, req.route.leastBound()) {
				return true
			}
		}
		trial := *req
		ok, err := trial.rewrite(budget, model)
		return ok || err != nil // a body the rewrite cannot edit: fitBudget refuses it whatever the hold
	}
}

// runCall takes a held call from its budget to its answer: it fits the request to what the
// call may spend, checks it against duplicates and forwards it. What it defers (a session's
// end, a fingerprint's, the in-flight gauge's) runs as it returns, before handleCall's
// deferred settlement. Its steps before forwarding (a named run's reservation, a session's
// claim, a fingerprint's check) run under actx, what is left of the call's admission budget:
// one past it refuses the call 503, and its hold is released at 0. So does a hold granted, or
// a step ended, only once that budget was spent (refuseLate): the call is never forwarded late.
func (s *Server) runCall(w http.ResponseWriter, r *http.Request, actx context.Context, c *call, in incomingCall) int {
	s.beforeStep(actx, stepHoldGranted)
	refuse := refuser(w, c.log)
	if status := s.refuseLate(w, r, c, in, "when its hold was granted", refuse); status != 0 {
		return status
	}
	if c.paidUnderPause {
		// Its admission budget is spent, and the steps before its forward (a named run's
		// reservation, a fingerprint's check) would fail at once under it: refused so, it was
		// answered 503 for the call it has paid for. They get a budget of their own.
		var cancel context.CancelFunc
		actx, cancel = admissionContext(r.Context(), time.Now().Add(s.cfg.Limits.AdmitTimeout))
		defer cancel()
	}
	sessionID := in.ids.sessionID
	message := sessionMessage(c, sessionID) // before fitBudget rewrites the request
	if status := s.fitBudget(actx, c, refuse); status != 0 {
		return status
	}

	// Duplicate checks come after the hold (DESIGN §6): the check and the registration of this
	// run then happen with no await in between, and a duplicate releases its fresh hold.
	switch {
	case sessionID != "" && !c.paidUnderPause:
		// (A message whose hold another process charged while its process was stopped takes no
		// session: paidUnderAPause.)
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		r = r.WithContext(ctx)
		if err := s.cancels.register(ctx, c.runID, cancel, c.log); err != nil {
			c.log.Warn("cancel bus unavailable; a newer message stops this run only once the bus subscribes", zap.Error(err))
		}
		defer s.cancels.unregister(c.runID)
		// The claim ends with the budget, and with a newer message of the session (ctx).
		cctx, cancelClaim := admissionContext(ctx, in.deadline)
		status := s.joinSession(cctx, w, c, sessionID, message, refuse)
		cancelClaim()
		if status != 0 {
			return status
		}
		defer s.endSessionCall(r.Context(), c)
	case in.fingerprinted:
		if status := s.checkFingerprint(w, r, actx, c, in.bodyHash, refuse); status != 0 {
			return status
		}
		// Runs before the deferred settlement and before the handler returns: whatever ends
		// the call, a resend after its answer is a new request.
		defer s.endFingerprint(r.Context(), c)
	}
	s.leases.Acquire(c.runID)
	c.leased = true
	s.metrics.ActiveCalls.Inc()
	defer s.metrics.ActiveCalls.Dec()
	if r.Context().Err() != nil {
		return s.refuseUnforwarded(w, r, c, refuse)
	}
	if status := s.refuseLate(w, r, c, in, "before forwarding", refuse); status != 0 {
		return status
	}
	w.Header().Set(RunIDHeader, c.runID) // forwarded from here on (a refusal above names no run)
	status := s.forward(w, r, c)
	if errors.Is(context.Cause(r.Context()), errSuperseded) && c.outcome != outcomeComplete {
		// (A call superseded after its answer was whole is not told it was stopped.)
		c.superseded = true
		status = s.answerSuperseded(c)
	}
	return status
}

// sessionMessage is the hash that tells a session's message apart (zero for a call without a
// session). It is the caller's request, hashed before the rewrite: the output bound the
// rewrite sets follows the cap, which the caller's other holds lower, and a message with no
// user turn (tool outputs alone) is hashed whole. Hashed after, a resend of the running
// message read as a new one and stopped it.
func sessionMessage(c *call, sessionID string) [32]byte {
	var message [32]byte
	if sessionID != "" {
		message = sessionMessageHash(c.req.route.format, c.req.body)
	}
	return message
}

// joinSession makes c its session's current run (claimSession), or answers it: a duplicate of
// the session's running message, or a refusal (refuse). It returns 0 to go on, else the status
// written.
func (s *Server) joinSession(ctx context.Context, w http.ResponseWriter, c *call, sessionID string, message [32]byte,
	refuse func(*apiError, string, error) int) int {
	e, err := s.claimSession(ctx, c, sessionID, message)
	if e == nil {
		return 0
	}
	if c.outcome == outcomeDuplicate {
		logRefusal(c.log, e, "duplicate of a running session message", nil, zap.String("of_run", e.RunID))
		s.writeDuplicate(w, e, false)
		return e.Status
	}
	if c.superseded {
		// Not to be retried: a retry would resend the old message and replace the newer one.
		w.Header().Set(shouldRetryHeader, "false")
	}
	return refuse(e, "session", err)
}

// refuseUnforwarded answers a call cancelled before anything was sent upstream (the client
// left, or a newer message of its session replaced it): nothing was used, release at 0.
func (s *Server) refuseUnforwarded(w http.ResponseWriter, r *http.Request, c *call, refuse func(*apiError, string, error) int) int {
	c.outcome = outcomeRefused
	if errors.Is(context.Cause(r.Context()), errSuperseded) {
		c.superseded = true
		// Not to be retried: a retry would resend the old message and replace the newer one.
		w.Header().Set(shouldRetryHeader, "false")
		return refuse(errSupersededAnswer, "superseded", nil)
	}
	e, why := ended(r.Context(), "before forwarding; hold released")
	logRefusal(c.log, e, why, nil)
	return answerClientClosed(w, r)
}

// refuseLate refuses a held call whose admission budget (in.deadline, incomingCall.deadline) is
// spent, at (when its hold was granted, or just before forwarding): 503 billing_unavailable,
// Retry-After: 1, and its hold released at 0 by the deferred settlement (outcomeRefused;
// a named run's call, as any failed call of it, leaves its run open). It returns 0 to go on.
//
// The steps that wait for the database are not all bound by their context: once a batch's
// writes and COMMIT are sent, the hold's outcome is waited for past its deadline (up to the
// driver's read timeout: holds.Writer.Admit), and so is a session claim's COMMIT. Such a hold
// or claim, granted after MariaDB stalled it on a lock, came back as a success, and the call
// went on to be forwarded (and charged) up to seconds after admit_timeout, past which the
// caller is promised a 503 and nothing held. The clock is compared with the deadline rather
// than asking actx: its timer fires on a goroutine of its own, a moment after the deadline.
//
// A hold another process has meanwhile charged (paidUnderAPause) is not refused: it is
// forwarded, the call its caller has paid for.
func (s *Server) refuseLate(w http.ResponseWriter, r *http.Request, c *call, in incomingCall, at string,
	refuse func(*apiError, string, error) int) int {
	late := time.Since(in.deadline)
	if late < 0 {
		return 0
	}
	if requestEnded(r) {
		return s.refuseUnforwarded(w, r, c, refuse)
	}
	if s.paidUnderAPause(r.Context(), c, in) {
		return 0
	}
	if requestEnded(r) {
		// Paid, but a newer message has taken its session since (paidUnderAPause stopped it).
		return s.refuseUnforwarded(w, r, c, refuse)
	}
	if c.superseded {
		// Paid, but a newer message of its session, unclaimed, came since (paidUnderAPause).
		c.outcome = outcomeRefused
		w.Header().Set(shouldRetryHeader, "false")
		return refuse(errSupersededAnswer, "superseded", nil)
	}
	if c.overtakenBy != "" {
		// Paid, but a retry under its Idempotency-Key ran the key since (paidUnderAPause): a
		// duplicate of the key's later attempt, released at 0 and its charge given back. Its
		// retry is that attempt's answer, replayed once it is stored.
		c.outcome = outcomeDuplicate
		e := errOvertaken(c.overtakenBy)
		logRefusal(c.log, e, "idempotent attempt paid under a pause, overtaken by a later attempt of its key; not forwarded", nil,
			zap.String("of_run", e.RunID))
		s.writeDuplicate(w, e, true)
		return e.Status
	}
	if c.unclaimed != nil {
		// Paid, but its forward could not be marked in its key's record (paidUnderAPause).
		c.outcome = outcomeRefused
		return refuse(errDedupDown, "idempotent attempt paid under a pause, its forward not marked in its key's record; hold released at 0",
			c.unclaimed)
	}
	c.outcome = outcomeRefused
	return refuse(errBillingDown, "admission budget spent "+at+"; hold released at 0",
		fmt.Errorf("%w %v before", errAdmitBudgetSpent, late.Round(time.Millisecond)))
}

// paidUnderAPause reports whether the hold of c, a call past its admission budget, has been
// settled at a charge by another process: its
// own process was stopped (SIGSTOP, a VM's live migration, a GC pause) between the hold's
// COMMIT and this check for longer than the hold lives, or than holds.dead_instance_after, and a
// reconciler took the unleased, untallied hold for a killed process's and charged what it held
// (DESIGN §5 rule 3). Refused, the caller was told 503, "not made, retry", for a call it was
// charged, and its retry was charged again; forwarded, it gets the call it paid for, as a call
// that the pause caught just after its forward does (README Known limits), whose settlement
// then changes nothing but gives back what the hold was charged beyond what the call used
// (refundPausedCharge). Only a call that came this late can have been so settled, so only such
// a call reads its hold: a database merely slow (a late grant, up to its read timeout) adds no
// round trip to its 503.
//
// A session's message so paid is forwarded too, and takes no session if it has not claimed
// one yet (runCall): its hold settled, it is no session's running message — a resend is not
// its duplicate, a newer message neither stops it nor is stopped by it (what it would stop is
// the message its caller sent since, the older replacing the newer). Unless its session's row
// names a message admitted after it (sessionTakenSince): forwarded, it was answered after its
// caller's latest, so it is answered superseded (c.superseded, refuseLate), as if it had
// claimed the session before that message did, its charge given back (refundPausedCharge). A
// named run's call is forwarded only when its run was charged what it held (reconcile_hold: no
// call of it tallied nor recorded on its row, none of it known to have been made), as the
// run's first call caught so leaves it; a run settled from its tally (its earlier calls)
// charged nothing for this call, whose 503 then tells the truth, and one its agent settled
// (POST .../settle) is closed.
//
// A session's message that claimed its session before the pause is forwarded only while its
// session's row still names it. A newer message that claimed the session since took over as
// its running message: one that found this hold open replaced it and sent it a cancel, which
// this process reads once resumed, in a race with this very check (won by the cancel, the
// message was refused superseded; lost, it was forwarded and cut a moment later, or answered
// whole after the newer message); one that found it settled replaced nothing, and the older
// message was answered after the newer one its caller sent since. Either way it is stopped
// here, as that cancel would have, and answered superseded: never forwarded, its charge given
// back (refundPausedCharge).
func (s *Server) paidUnderAPause(ctx context.Context, c *call, in incomingCall) bool {
	if c.paidUnderPause {
		return true // found at the grant; the check before forwarding need not read it again
	}
	if time.Since(in.arrived) < s.soonestChargedByPeer(c.inRun) {
		return false
	}
	sctx, cancel := s.storeContext(ctx)
	defer cancel()
	run, err := s.store.Run(sctx, c.user.ID, c.runID)
	if err != nil {
		c.log.Warn("hold of a call past its admission budget unreadable; refused as late", zap.Error(err))
		return false
	}
	if run.State != holds.StateSettled || run.ChargedMicro <= 0 ||
		(c.inRun && run.SettleSource.String != holds.SourceReconcileHold) {
		return false
	}
	if c.sessionClaimed && s.sessionMovedOn(sctx, c, in.ids.sessionID) {
		c.log.Named(holds.MoneyLog).Warn("hold charged by another process while this call waited past it (its process stopped), and a newer message has taken its session since; not forwarded",
			zap.String("settle_source", run.SettleSource.String), zap.Int64("charged_micro", run.ChargedMicro))
		s.cancels.deliver(c.runID) // as that message's cancel would have (unless it came already)
		return false
	}
	if !c.sessionClaimed && in.ids.sessionID != "" && s.sessionTakenSince(sctx, c, in.ids.sessionID, run) {
		c.log.Named(holds.MoneyLog).Warn("hold charged by another process while this call waited past it (its process stopped), and a newer message of its session came since; not forwarded",
			zap.String("settle_source", run.SettleSource.String), zap.Int64("charged_micro", run.ChargedMicro))
		c.superseded = true
		return false
	}
	if c.idem != nil {
		later, err := s.laterAttempt(sctx, c)
		if err != nil {
			c.log.Warn("later attempt of the Idempotency-Key of a call past its admission budget unreadable; refused as late", zap.Error(err))
			return false
		}
		if later == "" {
			later, err = s.claimForward(ctx, c)
		}
		switch {
		case err != nil && !s.cfg.Dedup.FailOpen:
			c.log.Named(holds.MoneyLog).Warn("hold charged by another process while this call waited past it (its process stopped), and its Idempotency-Key's record not marked; not forwarded",
				zap.String("settle_source", run.SettleSource.String), zap.Int64("charged_micro", run.ChargedMicro), zap.Error(err))
			c.unclaimed = err
			return false
		case err != nil:
			c.log.Warn("idempotency record of a call paid under a pause not marked; forwarded (fail_open)", zap.Error(err))
		case later != "":
			c.log.Named(holds.MoneyLog).Warn("hold charged by another process while this call waited past it (its process stopped), and a retry under its Idempotency-Key has run a later attempt since; not forwarded",
				zap.String("settle_source", run.SettleSource.String), zap.Int64("charged_micro", run.ChargedMicro), zap.String("later_run", later))
			c.overtakenBy = later
			return false
		}
	}
	c.log.Named(holds.MoneyLog).Warn("hold charged by another process while this call waited past it (its process stopped); forwarding the call it paid for",
		zap.String("settle_source", run.SettleSource.String), zap.Int64("charged_micro", run.ChargedMicro),
		zap.Duration("since_arrival", time.Since(in.arrived).Round(time.Millisecond)))
	c.paidUnderPause = true
	return true
}

// sessionMovedOn reports whether the row of c's session (sessionID), which c claimed, names
// another run now: a newer message's claim has taken it. A row pruned (its run settled and
// untouched for the prune's idle time) was taken by nobody; a read that fails says no, and
// the call goes on as its claim left it (a cancel sent to it still stops it).
func (s *Server) sessionMovedOn(ctx context.Context, c *call, sessionID string) bool {
	ref := holds.SessionRef{UserID: c.user.ID, SessionID: sessionID}
	now, err := s.store.CurrentSessionRuns(ctx, []holds.SessionRef{ref})
	if err != nil {
		c.log.Warn("session of a call paid under a pause unreadable; forwarded as its claim left it", zap.Error(err))
		return false
	}
	cur, ok := now[ref]
	return ok && cur != c.runID
}

// sessionTakenSince reports whether the row of c's session (sessionID), which c has not claimed,
// names a run admitted after c's (run, c's hold as read): a newer message of the session came
// while c's process was stopped and took the session, as it would have taken it from c had c
// claimed it first. A row that names an older run (the message c follows) or none leaves c the
// newest; a read that fails says no, and c is forwarded as it would have been.
func (s *Server) sessionTakenSince(ctx context.Context, c *call, sessionID string, run holds.Run) bool {
	ref := holds.SessionRef{UserID: c.user.ID, SessionID: sessionID}
	now, err := s.store.CurrentSessionRuns(ctx, []holds.SessionRef{ref})
	if err != nil {
		c.log.Warn("session of a call paid under a pause unreadable; forwarded", zap.Error(err))
		return false
	}
	cur, ok := now[ref]
	if !ok || cur == c.runID {
		return false
	}
	newer, err := s.store.Run(ctx, c.user.ID, cur)
	if err != nil {
		c.log.Warn("current run of the session of a call paid under a pause unreadable; forwarded", zap.String("current_run", cur), zap.Error(err))
		return false
	}
	return newer.CreatedAt.After(run.CreatedAt)
}

// budgetSpent reports whether ctx's deadline (a call's admission budget, admissionContext) has
// passed by the clock, as refuseLate tells it, not only once its timer has fired.
func budgetSpent(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// errAdmitBudgetSpent is why a call's admission context (admissionContext) ended when its
// admit_timeout ran out before forwarding: the caller is answered 503 (billing_unavailable, or
// its step's own), not as one that left.
var errAdmitBudgetSpent = errors.New("admit_timeout spent before forwarding")

// admissionContext is ctx ending at deadline, a call's admission budget (incomingCall.deadline),
// with errAdmitBudgetSpent as its cause then. Each step before forwarding runs under it (a
// store step's own bound, storeContext, and a Redis step's, redisStep, within it), so together
// they take at most admit_timeout from the body read whole: given one each, an Idempotency-Key
// retry that found its attempts settled one after another waited an admission, a lookup of the
// attempt's row and the next admission, each up to admit_timeout.
func admissionContext(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadlineCause(ctx, deadline, errAdmitBudgetSpent)
}

// callerEnded reports whether ctx, a step's admission context, ended for its request's sake
// (the caller left, the drain cut it, a newer message replaced it) rather than because the
// admission budget ran out.
func callerEnded(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), errAdmitBudgetSpent)
}

// incomingCall is a call's request as readCall accepted it.
type incomingCall struct {
	req     *callRequest
	body    []byte
	ids     callIDs
	arrived time.Time // its body read whole: the admission's clock starts here
	// deadline is arrived + admit_timeout: every step before forwarding runs by it
	// (admissionContext).
	deadline time.Time
	// fingerprinted: a plain request (no run, key or session), checked against the fingerprint
	// window. bodyHash names its request for that check (route, body, answerShaping) or for an
	// Idempotency-Key's record (route and body); empty when neither needs it.
	fingerprinted bool
	bodyHash      string
	// lease counts the request's body in memory until the call is over; an Idempotency-Key's
	// replay counts the stored answer it sends in it too.
	lease *bodyLease
	// log is readCall's logger, naming the run the call would be a call of: a refusal before
	// admission (its key revoked while the body arrived) names it as readCall's own do.
	log *zap.Logger
}

// readCall reads and checks a call's request before anything is held for it: its encoding and
// body, its JSON and the gateway's headers, and the earlier answers it sends back, which must
// be the caller's own. A refusal is written (refuse) and its status returned; nothing of it
// needs undoing.
//
// Its log lines name the run it would be a call of: runID, the one it would make for itself,
// or, with a valid X-Run-Id, the named run, which an operator searching by that run finds its
// refusals by (a bad body of an agent's call among them).
func (s *Server) readCall(w http.ResponseWriter, r *http.Request, rt *route, userID uint64, runID string, lease *bodyLease,
	callLog *zap.Logger) (incomingCall, int) {
	ids, idsErr := parseCallIDs(r.Header)
	log := callLog.WithLazy(zap.String("run_id", callRunID(userID, runID, ids, idsErr)))
	refuse := refuser(w, log)
	if aerr := checkContentEncoding(r.Header); aerr != nil {
		return incomingCall{}, refuse(aerr, "content encoding", nil)
	}
	if aerr := checkQuery(r.URL.RawQuery); aerr != nil {
		return incomingCall{}, refuse(aerr, "validation", nil)
	}
	reading := time.Now()
	body, aerr := readBody(w, r, s.cfg.Limits.MaxBodyBytes, s.cfg.Limits.ClientWriteTimeout, lease)
	if aerr != nil {
		return incomingCall{}, refuse(aerr, "body", nil)
	}
	arrived := time.Now()
	deadline := arrived.Add(s.cfg.Limits.AdmitTimeout)
	s.metrics.bodyPhase.Observe(arrived.Sub(reading).Seconds())
	req, aerr := s.parseCall(rt, body, r.Header)
	if aerr != nil {
		return incomingCall{}, refuse(aerr, "validation", nil)
	}
	if idsErr != nil {
		return incomingCall{}, refuse(idsErr, "validation", nil)
	}
	// The earlier answers' records are read within the admission budget too (each lookup has
	// its own, shorter bound, and goes on without them past it).
	actx, cancel := admissionContext(r.Context(), deadline)
	defer cancel()
	if cont := req.continues(); len(cont) > 0 {
		var foreign bool
		if req.carried, foreign = s.carriedContext(actx, userID, cont, req.previousResponse, log); foreign {
			// OpenAI's answer to an id it does not know: to this caller, it is none.
			return incomingCall{}, refuse(&apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "previous_response_not_found",
				Message: fmt.Sprintf("Previous response with id '%s' not found.", req.previousResponse), NoRetry: true}, "validation", nil)
		}
	}
	if len(req.itemIDs) > 0 {
		if id := s.foreignItem(actx, userID, req, log); id != "" {
			// The provider's answer to an item id it does not know: to this caller, it is none.
			return incomingCall{}, refuse(&apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "item_not_found",
				Message: fmt.Sprintf("Item with id '%s' not found.", id), NoRetry: true}, "validation", nil)
		}
	}
	if len(req.spokenIDs) > 0 {
		if id := s.hearAgain(actx, userID, req, log); id != "" {
			// Worded as for an id the provider does not know: to this caller, it is none.
			return incomingCall{}, refuse(&apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "audio_not_found",
				Message: fmt.Sprintf("Audio with id '%s' not found.", id), NoRetry: true}, "validation", nil)
		}
	}
	in := incomingCall{req: req, body: body, ids: ids, arrived: arrived, deadline: deadline, lease: lease, log: log}
	in.fingerprinted = ids == (callIDs{}) && s.cfg.Dedup.Window > 0
	switch {
	case ids.idemKey != "":
		in.bodyHash = requestHash(rt.path, body)
	case in.fingerprinted:
		in.bodyHash = requestHash(rt.path+answerShaping(r), body)
	}
	return in, 0
}

// answerShaping is what of a request, beside its route and body, the fingerprint window tells
// requests apart by: the query (an API version, Anthropic's ?beta=true) and the headers that
// change what a body asks for (isAnswerShaping), all forwarded upstream. The same body under
// another of them is another request, not a double click (the second was 409 duplicate while
// the first ran). Headers that differ between a request and its own resend (an SDK's retry
// count, a trace id) must not count, or the window would not catch the double. An
// Idempotency-Key's record keeps naming the route and body alone, as Stripe's keys do: a retry
// is the same request by its key. "" for a request with none of them, whose hash is then what
// it always was.
func answerShaping(r *http.Request) string {
	var names []string
	for name := range r.Header {
		if isAnswerShaping(name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 && r.URL.RawQuery == "" {
		return ""
	}
	slices.Sort(names)
	var b strings.Builder
	if r.URL.RawQuery != "" {
		b.WriteString("?" + r.URL.RawQuery)
	}
	for _, name := range names {
		for _, v := range r.Header[name] {
			b.WriteString("\n" + name + ": " + v)
		}
	}
	return b.String()
}

// isAnswerShaping: a beta feature or an API version. Anthropic's beta header is read under
// prefixed names too, as asksContext1M reads it.
func isAnswerShaping(name string) bool {
	return name == "Anthropic-Version" || name == "Openai-Beta" || strings.HasSuffix(strings.ToLower(name), "anthropic-beta")
}

// requestHash identifies a request to the duplicate checks (the fingerprint window, an
// Idempotency-Key's body): its route and its body. One body can be a request on two routes
// (embeddings and Responses both read "model" and "input"): without its route, a key's stored
// embeddings were replayed to a caller of /v1/responses, and a body running on one route made
// the same on the other a duplicate.
func requestHash(path string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// callIDs is how a request names itself: a caller-named run (X-Run-Id), a retry-safe request
// (Idempotency-Key), a conversation (X-Session-Id), or nothing.
type callIDs struct{ clientRunID, idemKey, sessionID string }

func parseCallIDs(h http.Header) (callIDs, *apiError) {
	ids := callIDs{clientRunID: h.Get("X-Run-Id"), idemKey: h.Get(IdempotencyKeyHeader), sessionID: h.Get(SessionHeader)}
	// Sent twice, a name is read as its first line, which may be empty: a retry whose first
	// Idempotency-Key line was empty ran as a plain call, and was charged again.
	for _, n := range [...]struct{ header, code string }{
		{"X-Run-Id", "invalid_run_id"}, {IdempotencyKeyHeader, "invalid_idempotency_key"}, {SessionHeader, "invalid_session_id"},
	} {
		if len(h.Values(n.header)) > 1 {
			return ids, errBadRequest(n.code, n.header+" must be sent once: this request sends it on more than one line.")
		}
	}
	switch {
	case ids.clientRunID != "" && !clientRunIDPattern.MatchString(ids.clientRunID):
		return ids, errBadRequest("invalid_run_id", "X-Run-Id must be 1-64 characters of A-Z a-z 0-9 . _ : -")
	case ids.clientRunID == "." || ids.clientRunID == "..":
		// A URL path drops a dot segment: /v1/runs/../settle reaches no run, or another route.
		return ids, errBadRequest("invalid_run_id", "X-Run-Id may not be . or .., which a URL path cannot name.")
	case gatewayRunIDPattern.MatchString(ids.clientRunID):
		return ids, errBadRequest("invalid_run_id", "X-Run-Id may not have the shape of the gateway's own run ids (r_ + 32 or x_ + 40 hex digits).")
	case ids.clientRunID != "" && (ids.idemKey != "" || ids.sessionID != ""):
		// A named run already is its own idempotency: its calls share one hold and settle once.
		return ids, errBadRequest("invalid_request", "X-Run-Id cannot be combined with Idempotency-Key or X-Session-Id.")
	case ids.idemKey != "" && !validIdempotencyKey(ids.idemKey):
		return ids, errBadRequest("invalid_idempotency_key", "Idempotency-Key must be 1-255 printable ASCII characters.")
	case ids.sessionID != "" && !clientRunIDPattern.MatchString(ids.sessionID):
		return ids, errBadRequest("invalid_session_id", "X-Session-Id must be 1-64 characters of A-Z a-z 0-9 . _ : -")
	}
	return ids, nil
}

// askedRunField is the name a named run's call sent (X-Run-Id) as asked_id, the field the
// settle route logs it by: its run_id is the gateway's hash of the user and that name, and an
// operator quoted "run agent:42 failed" finds the run's call lines by the name alone. A valid
// name is at most 64 characters (clientRunIDPattern); one refused as invalid is quoted up to
// maxLoggedBytes, as the settle route quotes an id it could not look up. A plain call has none.
func askedRunField(h http.Header) []zap.Field {
	name := h.Get("X-Run-Id")
	if name == "" {
		return nil
	}
	return []zap.Field{zap.String("asked_id", logged(name))}
}

// callRunID is the run a call's refusals before admission name (ids and idsErr: its headers,
// parseCallIDs): its valid X-Run-Id's named run, else runID, the one it makes for itself.
func callRunID(userID uint64, runID string, ids callIDs, idsErr *apiError) string {
	if idsErr == nil && ids.clientRunID != "" {
		return runIDFor(userID, ids.clientRunID)
	}
	return runID
}

// admitError maps an admission refusal to its answer.
func (s *Server) admitError(err error) *apiError {
	var busy *holds.TooManyInFlightError
	var debt *holds.InDebtError
	switch {
	case errors.As(err, &busy):
		return &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "too_many_in_flight",
			Message: inFlightMessage(busy), RetryAfter: inFlightRetryAfter}
	case errors.As(err, &debt):
		return &apiError{Status: http.StatusPaymentRequired, Type: "insufficient_quota", Code: "insufficient_credits",
			Message: fmt.Sprintf("No credits available: this account owes %s credits (calls that cost more than its balance had left). "+
				"A grant of prepaid credits pays the debt first; until then each day's allowance is reduced by it.",
				pricing.FormatCredits(debt.DebtMicro, s.creditMicro))}
	case errors.Is(err, holds.ErrInsufficient):
		return errInsufficient
	case errors.Is(err, errUnfitReleased):
		return errPromptOverCap
	case errors.Is(err, errUnfitNotReleased):
		return errBillingDown
	case errors.Is(err, holds.ErrUserDisabled), errors.Is(err, holds.ErrUnknownUser):
		return errBadKey
	case errors.Is(err, holds.ErrRunSettled):
		return errRunSettled
	case errors.Is(err, holds.ErrRunNotFound):
		return errRunNotFound
	case errors.Is(err, holds.ErrInvalidModel):
		return errBadRequest("invalid_model", "A model name must be UTF-8 text.")
	}
	return errBillingDown
}

// inFlightRetryAfter tells a caller refused for too many calls in flight when to come back: a
// slot frees when one of its calls finishes, usually within seconds. (The oldest hold's
// expiry, minutes away with the default hold_ttl, is only the latest bound: told that, capped
// at 30 s, every caller waited 30 s, since the OpenAI and Anthropic SDKs wait what
// Retry-After says before each retry.) A caller still refused is told again.
const inFlightRetryAfter = time.Second

// inFlightMessage words a refusal past max_in_flight. A named run holds its slot between its
// calls, until it is settled or idle past run_ttl: told only that calls were in flight and to
// retry when one finishes, a caller whose slots were held by runs it had left open (nothing in
// flight) retried every second for up to run_ttl, never learning that a settle frees them.
func inFlightMessage(busy *holds.TooManyInFlightError) string {
	if busy.OpenRuns <= 0 {
		return fmt.Sprintf("%d calls are already in flight for this account (limit %d). Retry when one finishes.", busy.InFlight, busy.Limit)
	}
	return fmt.Sprintf("%d holds are in flight for this account (limit %d), %d of them named runs (X-Run-Id) still open: "+
		"each keeps its slot between its calls until it is settled (POST /v1/runs/{id}/settle) or idle past its expiry. "+
		"Settle the runs you are done with, or retry when a call or run finishes.", busy.InFlight, busy.Limit, min(busy.OpenRuns, busy.InFlight))
}

// newRunID is a fresh run id for a call without a caller-chosen one.
func newRunID() string { return "r_" + token.New() }

// newAdmitToken marks this request's hold (holds.AdmitRequest.Token).
func newAdmitToken() string { return token.New() }

// requestEnded reports whether the gateway's side, not the upstream, ended the call: the
// caller left, a newer message of its session superseded it, or the drain's deadline cut it
// (context.Cause tells which).
func requestEnded(r *http.Request) bool { return r.Context().Err() != nil }

// isTimeout reports an upstream that did not answer in time.
func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
