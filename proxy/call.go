package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

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
	// on POST /v1/runs/{id}/settle or by reconciliation. laterCall: the run existed before.
	inRun, laterCall bool
	// reserving: this call of a named run reserved (or tried to reserve) part of the run's
	// budget under callID (reserveRunBudget); its tally gives it back.
	reserving bool
	callID    string
	// tallied: the call's tally must not be written again. For a named run's call the write
	// landed (finish retries one that did not); a plain call's one attempt
	// (tallyWithFingerprint) counts however it went, as a retry after a lost reply would count
	// the call twice.
	tallied bool
	// talliedAs is what tallyWithFingerprint wrote, nil if the write failed (it may or may not
	// have landed): the call's tally is corrected by what its settlement finds beyond it
	// (usage reported after a stream's final event), never on top of a write that may be missing.
	talliedAs *holds.Settlement
	// recorded: this call of a named run has been recorded on its run's row (recordRunCall),
	// which is done once: the row's figures are sums.
	recorded bool
	// recordMarked: its tally marked the call's record as still to come (a run whose Redis
	// record lost calls: runstate.RunBudget.ReleaseBeforeRecord), which recordRunCall drops.
	recordMarked bool
	// recordMarkUnknown: that tally failed, and may have landed with the mark (its reply
	// lost): the tally's later try, once the call is recorded, drops it (tallyCall).
	recordMarkUnknown bool
	// tallyMissed: a tally write of this call failed and was logged; a later try that lands
	// says so (tallyCall), or the log misleads.
	tallyMissed bool
	// recordFailed: its record on its run's row failed (recordRunCall), which may or may not
	// have landed: a tally that never lands may then leave the call out of its run's charge.
	recordFailed bool
	// leased: this call holds a lease on its run (taken just before forwarding), which it must
	// give back however it ends, or the heartbeat keeps the run alive and the reconciler never
	// settles it.
	leased bool
	held   time.Time // when its hold was granted
	ended  time.Time
	// idem is set for an Idempotency-Key request; rw then keeps what the caller was sent.
	idem *idemCall
	rw   *respWriter
	// idemPinned: the idempotency record holds this attempt's answer (pinBeforeAnswer).
	idemPinned bool
	// fpKey is the fingerprint this plain call registered (dedup window); it is given back
	// (endFingerprint) before the end of the call's answer reaches the caller.
	fpKey string
	// sessionClaimed: this call is its session's current run; endSessionCall marks its end.
	sessionClaimed bool
	// superseded: a newer message of its session stopped this call.
	superseded bool
}

// RunIDHeader carries the run id of every answered model call, so a caller can look its run up.
const RunIDHeader = "X-Tollgate-Run-Id"

// serveCall handles one model route: validate, admit, rewrite, forward, and settle in a
// deferred path that runs however the request ends.
func (s *Server) serveCall(rt *route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		user := userFrom(r.Context())
		// Lazy: most calls log nothing, and encoding the fields up front was 2 % of the
		// gateway's CPU under load.
		callLog := s.log.WithLazy(zap.Uint64("user_id", user.ID), zap.String("route", rt.path))
		runID := newRunID()
		if !s.calls.enter() {
			e := errShuttingDown
			logRefusal(callLog, e, "shutting down", nil, zap.String("run_id", runID))
			writeError(w, e)
			s.metrics.Requests.WithLabelValues(rt.path, codeLabel(e.Status)).Inc()
			return
		}
		defer s.calls.leave()
		status := s.handleCall(w, r, rt, user, runID, callLog)
		s.metrics.Requests.WithLabelValues(rt.path, codeLabel(status)).Inc()
	}
}

// handleCall serves one call; callLog is the logger of the request, without a run id: the
// call's run id may change (a named run, an Idempotency-Key's), and a line must name one run.
func (s *Server) handleCall(w http.ResponseWriter, r *http.Request, rt *route, user holds.User, runID string, callLog *zap.Logger) int {
	log := callLog.WithLazy(zap.String("run_id", runID))
	refuse := func(e *apiError, reason string, err error) int {
		logRefusal(log, e, reason, err)
		writeError(w, e)
		return e.Status
	}
	in, refused := s.readCall(w, r, rt, user.ID, log, refuse)
	if refused != 0 {
		return refused
	}
	req, body, ids, arrived := in.req, in.body, in.ids, in.arrived
	clientRunID, idemKey, sessionID := ids.clientRunID, ids.idemKey, ids.sessionID
	// A caller-named run groups many calls under one hold; without a name a call is a run of
	// one that settles when it ends.
	ttl := s.cfg.Holds.HoldTTL
	if clientRunID != "" {
		runID, ttl = runIDFor(user.ID, clientRunID), s.cfg.Holds.RunTTL
		log = callLog.WithLazy(zap.String("run_id", runID))
	}
	// Plain requests (no run, key or session) go through the fingerprint window.
	fingerprinted := ids == (callIDs{}) && s.cfg.Dedup.Window > 0
	var bodyHash string
	if idemKey != "" || fingerprinted {
		bodyHash = requestHash(rt.path, body)
	}
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
	)
	if idemKey != "" {
		idem = &idemCall{key: idemKey, userID: user.ID, bodyHash: bodyHash, body: body}
		idem.record = s.keys.Replay(idempotentRunID(user.ID, idemKey, 0))
		var answered int
		hold, answered = s.admitIdempotent(w, r, idem, &ar, callLog)
		idem.body = nil // the call keeps its record's name, not its body, until it settles
		if answered != 0 {
			return answered
		}
		runID = ar.RunID
		log = callLog.WithLazy(zap.String("run_id", runID))
	} else if hold, err = s.writer.Admit(r.Context(), ar); err != nil {
		s.releaseLostAdmission(r.Context(), ar, err, log)
		if r.Context().Err() != nil {
			logRefusal(log, errClientClosed, "client left during admission; nothing held", err)
			return answerClientClosed(w, r)
		}
		return refuse(s.admitError(err), "admission", err)
	}

	c := &call{req: req, user: user, hold: hold, runID: runID, log: log, meter: metering.NewMeter(rt.format),
		inRun: clientRunID != "", laterCall: hold.Existing, idem: idem, held: time.Now()}
	s.metrics.admitPhase.Observe(c.held.Sub(arrived).Seconds())
	if idem != nil || sessionID != "" {
		c.rw = &respWriter{ResponseWriter: w, capture: idem != nil, limit: s.cfg.Dedup.MaxReplayLen}
		w = c.rw
	}
	// From here on the hold exists, and this deferred settlement is what closes it: it runs on
	// success, error, client cancel and panic alike.
	defer s.finish(r.Context(), c)

	// The cap bounds what is charged; at a discount a call may cost more than that at list
	// price, which is what the rewrite and the run's budget count in. Checked before a session
	// claims the call: a message refused for its cost must not stop the session's running one.
	// (A named run has no session nor fingerprint: its reservation keeps its place, right
	// after the hold.)
	// A session's message is told apart by the caller's request, hashed before the rewrite: the
	// output bound the rewrite sets follows the cap, which the caller's other holds lower, and
	// a message with no user turn (tool outputs alone) is hashed whole. Hashed after, a resend
	// of the running message read as a new one and stopped it.
	var message [32]byte
	if sessionID != "" {
		message = sessionMessageHash(req.route.format, req.body)
	}
	budget := pricing.MaxCostWithin(hold.CapMicro, hold.DiscountBP)
	exhausted := errPromptOverCap
	if c.inRun {
		granted, e, err := s.reserveRunBudget(r.Context(), c, budget)
		if e != nil {
			c.outcome = outcomeRefused
			return refuse(e, "run budget", err)
		}
		budget, exhausted = granted, errRunBudget
	}
	ok, err := req.rewrite(budget, s.cfg.Models[req.priceKey])
	if err != nil {
		c.outcome = outcomeRefused
		return refuse(errBuildUpstream, "rewrite", err)
	}
	if !ok {
		c.outcome = outcomeRefused
		return refuse(exhausted, "budget below the cost of the prompt", nil)
	}

	// Duplicate checks come after the hold (DESIGN §6): the check and the registration of this
	// run then happen with no await in between, and a duplicate releases its fresh hold.
	switch {
	case sessionID != "":
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		r = r.WithContext(ctx)
		if err := s.cancels.register(ctx, runID, cancel); err != nil {
			log.Warn("cancel bus unavailable; a newer message cannot stop this run", zap.Error(err))
		}
		defer s.cancels.unregister(runID)
		if e, err := s.claimSession(ctx, c, sessionID, message); e != nil {
			if c.outcome == outcomeDuplicate {
				logRefusal(log, e, "duplicate of a running session message", nil, zap.String("of_run", e.RunID))
				s.writeDuplicate(w, e, false)
				return e.Status
			}
			return refuse(e, "session", err)
		}
		defer s.endSessionCall(r.Context(), c)
	case fingerprinted:
		if status := s.checkFingerprint(w, r, c, bodyHash, refuse); status != 0 {
			return status
		}
		// Runs before the deferred settlement and before the handler returns: whatever ends
		// the call, a resend after its answer is a new request.
		defer s.endFingerprint(r.Context(), c)
	}
	s.leases.Acquire(runID)
	c.leased = true
	s.metrics.ActiveCalls.Inc()
	defer s.metrics.ActiveCalls.Dec()
	if r.Context().Err() != nil {
		// Cancelled before anything was sent upstream (the client left, or a newer message of
		// its session replaced it): nothing was used, release at 0.
		c.outcome = outcomeRefused
		if errors.Is(context.Cause(r.Context()), errSuperseded) {
			c.superseded = true
			// Not to be retried: a retry would resend the old message and replace the newer one.
			w.Header().Set(shouldRetryHeader, "false")
			return refuse(errSupersededAnswer, "superseded", nil)
		}
		logRefusal(log, errClientClosed, "client left before forwarding; hold released", nil)
		return answerClientClosed(w, r)
	}
	w.Header().Set(RunIDHeader, runID) // forwarded from here on (a refusal above names no run)
	status := s.forward(w, r, c)
	if errors.Is(context.Cause(r.Context()), errSuperseded) && c.outcome != outcomeComplete {
		// (A call superseded after its answer was whole is not told it was stopped.)
		c.superseded = true
		status = s.answerSuperseded(c)
	}
	return status
}

// incomingCall is a call's request as readCall accepted it.
type incomingCall struct {
	req     *callRequest
	body    []byte
	ids     callIDs
	arrived time.Time // its body read whole: the admission's clock starts here
}

// readCall reads and checks a call's request before anything is held for it: its encoding and
// body, its JSON and the gateway's headers, and the earlier answers it sends back, which must
// be the caller's own. A refusal is written (refuse) and its status returned; nothing of it
// needs undoing.
func (s *Server) readCall(w http.ResponseWriter, r *http.Request, rt *route, userID uint64, log *zap.Logger,
	refuse func(*apiError, string, error) int) (incomingCall, int) {
	if aerr := checkContentEncoding(r.Header); aerr != nil {
		return incomingCall{}, refuse(aerr, "content encoding", nil)
	}
	reading := time.Now()
	body, aerr := readBody(w, r, s.cfg.Limits.MaxBodyBytes, s.cfg.Limits.ClientWriteTimeout)
	if aerr != nil {
		return incomingCall{}, refuse(aerr, "body", nil)
	}
	arrived := time.Now()
	s.metrics.bodyPhase.Observe(arrived.Sub(reading).Seconds())
	req, aerr := s.parseCall(rt, body, r.Header)
	if aerr != nil {
		return incomingCall{}, refuse(aerr, "validation", nil)
	}
	ids, aerr := parseCallIDs(r.Header)
	if aerr != nil {
		return incomingCall{}, refuse(aerr, "validation", nil)
	}
	if cont := req.continues(); len(cont) > 0 {
		var foreign bool
		if req.carried, foreign = s.carriedContext(r.Context(), userID, cont, req.previousResponse, log); foreign {
			// OpenAI's answer to an id it does not know: to this caller, it is none.
			return incomingCall{}, refuse(&apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "previous_response_not_found",
				Message: fmt.Sprintf("Previous response with id '%s' not found.", req.previousResponse), NoRetry: true}, "validation", nil)
		}
	}
	if len(req.spokenIDs) > 0 {
		if id := s.hearAgain(r.Context(), userID, req, log); id != "" {
			// Worded as for an id the provider does not know: to this caller, it is none.
			return incomingCall{}, refuse(&apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "audio_not_found",
				Message: fmt.Sprintf("Audio with id '%s' not found.", id), NoRetry: true}, "validation", nil)
		}
	}
	return incomingCall{req: req, body: body, ids: ids, arrived: arrived}, 0
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
	switch {
	case ids.clientRunID != "" && !clientRunIDPattern.MatchString(ids.clientRunID):
		return ids, errBadRequest("invalid_run_id", "X-Run-Id must be 1-64 characters of A-Z a-z 0-9 . _ : -")
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

// checkFingerprint answers a plain request whose body the same user sent moments ago while
// that first request still runs. It returns the status it answered with, or 0 to go on.
// Redis out of reach is a refusal unless dedup.fail_open: a silent double run costs money.
func (s *Server) checkFingerprint(w http.ResponseWriter, r *http.Request, c *call, bodyHash string,
	refuse func(*apiError, string, error) int) int {
	orig, err := s.fingerprint(r.Context(), c.user.ID, bodyHash, c.runID)
	var dbDown errStoreDown
	switch {
	case err != nil && r.Context().Err() != nil:
		c.outcome = outcomeRefused
		logRefusal(c.log, errClientClosed, "client left during the duplicate check; hold released", err)
		return answerClientClosed(w, r)
	case errors.As(err, &dbDown):
		c.outcome = outcomeRefused
		return refuse(errBillingDown, "fingerprint check failed", err)
	case err != nil && !s.cfg.Dedup.FailOpen:
		c.outcome = outcomeRefused
		return refuse(errDedupDown, "fingerprint check failed; refusing rather than risk a double run", err)
	case err != nil:
		c.log.Warn("fingerprint check failed; going on (fail_open)", zap.Error(err))
	case orig != "":
		c.outcome = outcomeDuplicate
		e := errDuplicate(orig)
		logRefusal(c.log, e, "duplicate of a running request", nil, zap.String("of_run", orig))
		s.writeDuplicate(w, e, false)
		return e.Status
	default:
		c.fpKey = s.keys.Dedup(c.user.ID, bodyHash)
	}
	return 0
}

// answerSuperseded tells a caller still connected that its call was stopped because a newer
// message of its session replaced it: an error answer when nothing was sent yet, an error
// event at the end of a stream already under way.
func (s *Server) answerSuperseded(c *call) int {
	rw := c.rw
	if rw.status == 0 {
		rw.Header().Set(shouldRetryHeader, "false") // a retry would replace the newer message
		writeError(rw, errSupersededAnswer)
		return errSupersededAnswer.Status
	}
	if isEventStream(rw.Header().Get("Content-Type")) {
		rc := http.NewResponseController(rw)
		bound := s.boundWrites(rc)
		_, _ = bound.write(rw, streamErrorEvent(c.req.route.format, errSupersededAnswer))
		_ = rc.Flush()
	}
	return rw.status
}

// admitError maps an admission refusal to its answer.
func (s *Server) admitError(err error) *apiError {
	var busy *holds.TooManyInFlightError
	switch {
	case errors.As(err, &busy):
		return &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "too_many_in_flight",
			Message:    fmt.Sprintf("%d calls are already in flight for this account (limit %d). Retry when one finishes.", busy.InFlight, busy.Limit),
			RetryAfter: busy.RetryAfter}
	case errors.Is(err, holds.ErrInsufficient):
		return errInsufficient
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

// finish settles a call. It runs after the handler, whatever ended it, and hands the work to
// a settlement that outlives the request: the client's cancellation must not cancel the
// charge for what it already used.
func (s *Server) finish(reqCtx context.Context, c *call) {
	if p := recover(); p != nil {
		c.log.Error("panic while serving; settling what was used", zap.Any("panic", p))
		c.outcome = outcomeStreamError
		defer panic(p)
	}
	c.ended = time.Now()
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
		s.tallyCall(ctx, c, st)
		s.settle(ctx, c, st)
		return
	}
	if c.inRun {
		s.finishRunCall(ctx, c, st)
		return
	}
	s.finishPlainCall(ctx, c, st)
}

// finishRunCall records the end of a named run's call: its tally (a complete answer's was
// written before its end reached the caller: tallyBeforeAnswer) and its row's record. The run
// stays open; it is settled on request or by the reconciler.
func (s *Server) finishRunCall(ctx context.Context, c *call, st holds.Settlement) {
	if !c.tallied {
		c.tallied = s.tallyCall(ctx, c, st)
	}
	s.endRunCall(ctx, c, st)
	if !c.tallied {
		// The tally is the run's only record of the call (and, for a call that used
		// nothing, the evidence that keeps a run nobody comes back to from being charged
		// its hold): keep trying, as markRunUnused does, for as long as a settlement
		// would. Every step is safe to repeat.
		s.settlements.start()
		s.inBackground(func() {
			defer s.settlements.leave()
			s.retryRunTally(ctx, c, st)
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
		if c.tallied {
			// With its fingerprint, before the answer's end (tallyWithFingerprint); what was
			// metered after that (rare: an upstream that went on past its final event) is
			// added first.
			if c.talliedAs != nil {
				du, dc, dEst := st.Usage.Sub(c.talliedAs.Usage), st.CostMicro-c.talliedAs.CostMicro, estimatedCalls(st)-estimatedCalls(*c.talliedAs)
				if dc != 0 || dEst != 0 || du != (pricing.Usage{}) {
					s.correctTally(ctx, c, st, du, dc, dEst)
				}
			}
			s.settle(ctx, c, st)
			return
		}
		tallied := make(chan struct{})
		go func() {
			defer close(tallied)
			s.tallyCall(ctx, c, st)
		}()
		s.settle(ctx, c, st)
		<-tallied
	}
	s.inBackground(work)
}

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

// tallyRetryFirst and tallyRetryMost are the first and the longest pause between tries of a
// tally write that must land (markRunUnused, retryRunTally): Redis back from a blip is found
// within a tenth of a second, one that is down is not asked more than every two.
const (
	tallyRetryFirst = 100 * time.Millisecond
	tallyRetryMost  = 2 * time.Second
)

// markRunUnused writes a named run's zero tally, retrying for as long as a settlement would
// (the writes are safe to repeat): without it a run nobody comes back to is charged its hold.
func (s *Server) markRunUnused(ctx context.Context, runID string, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
	defer cancel()
	for wait := tallyRetryFirst; ; wait = min(2*wait, tallyRetryMost) {
		err := s.tally.MarkUnused(ctx, runID)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			s.metrics.TallyFailures.Inc()
			log.Error("zero tally of a run with a lost admission not written; it will be charged its hold", zap.Error(err))
			return
		case <-time.After(wait):
		}
	}
}

// retryRunTally writes a named run's call to its tally until it lands or settle_timeout has
// passed.
func (s *Server) retryRunTally(ctx context.Context, c *call, st holds.Settlement) {
	deadline := time.Now().Add(s.cfg.Limits.SettleTimeout)
	for wait := tallyRetryFirst; time.Now().Before(deadline); wait = min(2*wait, tallyRetryMost) {
		time.Sleep(wait)
		if s.tallyCall(ctx, c, st) {
			return
		}
	}
	s.runTallyGivenUp(c, st)
}

// answerFinal is called when a call's answer is whole and its end about to reach the caller:
// what the call claimed against duplicates is given back (its fingerprint; its session's
// "running" mark), so the same request sent the moment the answer ends is a new one, not a
// duplicate of a call whose settlement is still on its way. Each step is safe to repeat; the
// handler's defers repeat them for calls that end otherwise.
func (s *Server) answerFinal(ctx context.Context, c *call) {
	s.endFingerprint(ctx, c)
	s.endSessionCall(ctx, c)
}

// tallyBeforeAnswer tallies a call of a named run whose answer is complete (or broken off, its
// error event still to go) but whose end the caller has not been sent yet: a caller that
// settles its run the moment the answer ends must find the call in the run's tally, not get
// 409 run_busy for a call it saw finish.
func (s *Server) tallyBeforeAnswer(ctx context.Context, c *call) {
	ctx = context.WithoutCancel(ctx)
	st := s.settlementOf(c)
	// A failed write is tried again when the call ends, then until settle_timeout (finishRunCall;
	// a named run's steps are safe to repeat): the tally is the run's only record of the call.
	// First, since it gives the call's reservation back: a call of the run reserving while the
	// row already recorded this one and its reservation still stood would count it twice (the
	// run's budget counts the row's record as spent, Hold.RecordedMicro), and be refused with
	// the cap half unused.
	c.tallied = s.tallyCall(ctx, c, st)
	// The run's row records the call before its end reaches the caller too: after a Redis
	// restart the tally has only the calls made since, and a settle sent the moment the answer
	// ends, reading a row without this call, would charge the larger of the two records rather
	// than both calls (and the call's record would then find its run settled). A settle that
	// comes between the two writes finds the call still in flight (its tally's record-to-come
	// mark, runstate.RunBudget.ReleaseBeforeRecord, on a run whose Redis record lost calls)
	// and is refused run_busy.
	s.recordRunCall(ctx, c, st)
	// The call is over but for its last bytes; a run settled now must not find its lease
	// (CloseRun refuses a leased run).
	s.releaseLease(ctx, c)
}

// tallyCall records a call's usage in Redis: if this process dies before the call's
// settlement commits, the reconciler settles from the tally. It need not precede the
// settlement: a committed settlement makes the tally moot, and one that fails leaves its run
// to the reconciler only once its hold has expired (minutes), long after this write (bounded
// by tallyWriteTimeout) has landed or failed. Only a crash before the write lands loses it,
// the same window as writing it first.
//
// A call that used nothing (refused, duplicate, upstream error) records that it used nothing:
// without a tally the reconciler would charge a run whose release at 0 failed what it held.
func (s *Server) tallyCall(ctx context.Context, c *call, st holds.Settlement) (ok bool) {
	tctx, cancel := context.WithTimeout(ctx, tallyWriteTimeout)
	defer cancel()
	var err error
	switch {
	case c.reserving && !c.recorded:
		// Its record on the run's row follows (recordRunCall): the run is not settled between.
		c.recordMarked, err = s.budgets.ReleaseBeforeRecord(tctx, c.runID, c.callID, st.Usage, st.CostMicro, st.Estimated)
		c.recordMarkUnknown = err != nil
	case c.reserving:
		err = s.budgets.Release(tctx, c.runID, c.callID, st.Usage, st.CostMicro, st.Estimated)
		if err == nil && c.recordMarkUnknown {
			s.dropRecordMark(tctx, c)
		}
	case st.CostMicro == 0 && st.Usage == (pricing.Usage{}):
		err = s.tally.MarkUnused(tctx, c.runID)
	default:
		err = s.tally.Add(tctx, c.runID, st.Usage, st.CostMicro, st.Estimated)
	}
	if err != nil {
		s.tallyFailed(c, st, err)
		c.tallyMissed = true
		return false
	}
	if c.tallyMissed {
		c.tallyMissed = false
		c.log.Info("run tally written on a later try")
	}
	return true
}

// dropRecordMark drops the record-to-come mark a failed ReleaseBeforeRecord may have left (it
// ran and its every reply was lost), once the call is recorded on its run's row and its tally
// has landed on a later try: Redis answers again, and the mark, unknown to the call, kept the
// run's settle at 409 run_busy with nothing in flight until it lapsed (the lease TTL).
func (s *Server) dropRecordMark(ctx context.Context, c *call) {
	c.recordMarkUnknown = false
	if err := s.budgets.Recorded(ctx, c.runID, c.callID); err != nil {
		c.log.Warn("run call's record not marked; the run's settlement waits until the mark lapses", zap.Error(err))
	}
}

// tallyWriteTimeout bounds one tally write. A call's own tally goes out after its answer (or
// just before its end), so a Redis that hangs must not hold the call's settlement, or a
// caller's next request, for longer than this.
const tallyWriteTimeout = 2 * time.Second

// wholeOutcome is how a call whose answer is whole ends: complete, unless the upstream reported
// an error in it.
func (c *call) wholeOutcome() outcome {
	if c.meter.Result().UpstreamError {
		return outcomeStreamError
	}
	return outcomeComplete
}

// correctTally adds to a call's tally what its settlement found beyond what tallyWithFingerprint
// wrote (du, dc and dEst may be negative: a later usage report replaces an earlier one, or an
// estimate).
func (s *Server) correctTally(ctx context.Context, c *call, st holds.Settlement, du pricing.Usage, dc, dEst int64) {
	tctx, cancel := context.WithTimeout(ctx, tallyWriteTimeout)
	defer cancel()
	if err := s.tally.Correct(tctx, c.runID, du, dc, dEst); err != nil {
		s.tallyFailed(c, st, err)
	}
}

// estimatedCalls is how a call's settlement counts in its tally's estimated calls.
func estimatedCalls(st holds.Settlement) int64 {
	if st.Estimated {
		return 1
	}
	return 0
}

// tallyFailed counts and logs a tally write that failed. A plain call settles from this
// process's figures, the tally only its fallback. A named run is charged the larger of its
// tally and its row's record, which records every call that ended (recordRunCall), so a lost
// tally write loses nothing while the record lands: the first failure is a warning (not one
// per try: a Redis out of reach for a minute made dozens of lines per call), and only a call
// whose tally never lands and whose record failed too may be missing (runTallyGivenUp).
func (s *Server) tallyFailed(c *call, st holds.Settlement, err error) {
	s.metrics.TallyFailures.Inc()
	switch {
	case !c.inRun:
		c.log.Warn("tally write failed; settling from process figures", zap.Error(err))
	case !c.tallyMissed:
		c.log.Warn("run tally write failed; tried again until settle_timeout, the run's row records the call",
			append(callFigures(st), zap.Error(err))...)
	}
}

// runTallyGivenUp logs a named run's call whose tally writes all failed (retryRunTally). Its
// run's row records it unless that write failed too; then the call may be missing from its
// run's charge, and this line, with its figures, is its only record.
func (s *Server) runTallyGivenUp(c *call, st holds.Settlement) {
	if c.recordFailed {
		c.log.Error("run call may be missing from its run's charge: its tally was never written and its row's record failed",
			callFigures(st)...)
		return
	}
	c.log.Warn("run tally never written; the run's row records the call", callFigures(st)...)
}

// callFigures are the log fields of what a call is charged.
func callFigures(st holds.Settlement) []zap.Field {
	return []zap.Field{zap.Int64("cost_micro", st.CostMicro), zap.Int64("in_tok", st.Usage.Input), zap.Int64("out_tok", st.Usage.Output),
		zap.Int64("cache_read_tok", st.Usage.CacheRead), zap.Int64("cache_write_tok", st.Usage.CacheWrite),
		zap.Int64("cache_write_1h_tok", st.Usage.CacheWrite1h), zap.Int64("audio_in_tok", st.Usage.AudioInput),
		zap.Int64("audio_out_tok", st.Usage.AudioOutput), zap.Bool("estimated", st.Estimated)}
}

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
	s.settlements.start()
	release := func(keepTrying bool) {
		defer s.settlements.leave()
		if ar.Fresh {
			tctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
			if err := s.tally.MarkUnused(tctx, ar.RunID); err != nil {
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
		default:
			s.metrics.Settlements.WithLabelValues(holds.SourceAdmitLost, strconv.FormatBool(res.Applied)).Inc()
			log.Info("lost admission released", zap.Bool("applied", res.Applied))
		}
	}
	// In the request (no slot free), one try: the caller's 503 waits for it, and must not wait
	// for an outage to end.
	if !s.tryBackground(func() { release(true) }) {
		release(false)
	}
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

// settle commits one settlement with its own deadline and retries, then drops the lease.
// A settlement that gives up leaves the hold to expire and the reconciler to settle it from
// the tally.
func (s *Server) settle(ctx context.Context, c *call, st holds.Settlement) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
	defer cancel()
	// Settled or not, the call is over: without its lease, a run whose settlement failed is
	// the reconciler's once its hold expires.
	defer s.releaseLease(ctx, c)
	res, err := s.writer.Settle(ctx, st)
	if err != nil {
		s.metrics.SettleFailures.Inc()
		c.log.Error("settlement failed; the reconciler will settle this run", zap.Error(err))
		return
	}
	s.metrics.SettleSeconds.Observe(time.Since(c.ended).Seconds())
	s.metrics.Settlements.WithLabelValues(st.Source, strconv.FormatBool(res.Applied)).Inc()
	c.log.Debug("settled", zap.String("source", st.Source), zap.Bool("applied", res.Applied),
		zap.Int64("charged_micro", res.ChargedMicro), zap.Bool("estimated", st.Estimated))
}

// leaseReleaseTimeout bounds deleting a lease key; one that is not deleted lapses after the
// lease TTL, since this process no longer refreshes it.
const leaseReleaseTimeout = 2 * time.Second

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
		if res := c.meter.Result(); res.UpstreamError && !res.Reported && !res.Produced() {
			// The provider said it failed (an error event after its 200) before it produced
			// anything and without a usage: as for a refusal with a non-2xx status, nothing was
			// used. (A stream that only broke, with no word from the provider, keeps the
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
	} else {
		st.Usage = c.req.promptEstimate()
		st.Usage.Output, st.Usage.AudioOutput = res.EstimatedOutput()
		st.Estimated = true
	}
	price := c.req.price
	if p, key, ok := s.answeredPrice(c, res.Model); ok {
		price, st.PriceSnapshot = p, s.snapshots[key]
	}
	st.CostMicro = price.Cost(st.Usage)
	return st
}

// answeredPrice is the price of the model the upstream says answered, when that is priced
// under another configured name than the model asked for: the call is billed for what ran
// (an alias answered by a dearer snapshot, a router that picked another model). An answer
// naming no model, the same one, or one without a price is billed at the price asked for.
func (s *Server) answeredPrice(c *call, answered string) (pricing.Price, string, bool) {
	if answered == "" || answered == c.req.model {
		return pricing.Price{}, "", false
	}
	p, key, err := s.prices.Lookup(answered)
	if err != nil || key == c.req.priceKey {
		return pricing.Price{}, "", false
	}
	c.log.Info("billed at the price of the model that answered", zap.String("asked", c.req.model),
		zap.String("answered", answered), zap.String("priced_as", key))
	return p, key, true
}

// priceSnapshots records, per configured model, the prices a run is billed at, so the bill can
// be explained after the price table changes. Built once: the table is fixed for a process.
func priceSnapshots(prices *pricing.Table) map[string][]byte {
	out := map[string][]byte{}
	for _, name := range prices.Models() {
		p, _, _ := prices.Lookup(name)
		out[name] = p.Snapshot(name)
	}
	return out
}

// newRunID is a fresh run id for a call without a caller-chosen one.
func newRunID() string { return "r_" + token.New() }

// newAdmitToken marks this request's hold (holds.AdmitRequest.Token).
func newAdmitToken() string { return token.New() }

// clientGone reports whether the caller, not the upstream, ended the call.
func clientGone(r *http.Request) bool { return r.Context().Err() != nil }

// isTimeout reports an upstream that did not answer in time.
func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
