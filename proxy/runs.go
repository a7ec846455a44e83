package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

var (
	errRunSettlesItself = &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "run_in_progress",
		Message: "This run is one call, still in progress; it settles itself when the call ends. Only runs named with X-Run-Id are settled on request."}
	// errRunBusy says when to ask again: a call's end is tallied within a moment of its last
	// byte. The OpenAI and Anthropic SDKs retry a 409 after its Retry-After (twice, by
	// default); an agent's own settle loop should not have to guess either.
	errRunBusy = &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "run_busy",
		Message: "Calls of this run are still in flight, or their usage is not recorded yet; settle it again once they have ended.", RetryAfter: time.Second}
)

// errSettleUnanswered answers a settle whose settlement's COMMIT went out unanswered: it may
// have charged the run, and "the call was not made" would tell the agent it had not.
var errSettleUnanswered = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "billing_unavailable",
	Message:    "Billing became unavailable as the run's settlement was committing: the run may be settled. Settle again (it shows the settled run, or settles it) or GET /v1/runs/{id} to see.",
	RetryAfter: time.Second}

// errSettleNotDone answers a settle that charged nothing, billing being unavailable: the run is
// reopened (its close undone, if Redis is there to undo it) and a retry settles it.
// errBillingDown's "the call was not made" left an agent unsure whether its run was settled.
var errSettleNotDone = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "billing_unavailable",
	Message:    "Billing is unavailable, so the run was not settled and nothing was charged. Retry shortly.",
	RetryAfter: time.Second}

// errSettleRunUnread answers a settle that could not read the run: it did nothing, but the run
// may be settled already, by an earlier settle whose answer was lost or errSettleUnanswered (the
// retry that answer asks for). errSettleNotDone's "the run was not settled" told that retry so
// of a run its first settle had charged.
var errSettleRunUnread = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "billing_unavailable",
	Message:    "Billing is unavailable, so the run could not be read and this settle charged nothing; an earlier settle of it may have settled it. Retry shortly (it shows the settled run, or settles it) or GET /v1/runs/{id} to see.",
	RetryAfter: time.Second}

// errSettleShuttingDown answers a settle that reached a draining gateway: nothing was done,
// and another instance (or this one, restarted) takes the retry.
var errSettleShuttingDown = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "shutting_down",
	Message: "The gateway is shutting down, so the run was not settled and nothing was charged. Retry.", RetryAfter: time.Second}

var errRunBudget = &apiError{Status: http.StatusPaymentRequired, Type: "insufficient_quota", Code: "run_budget_exhausted",
	Message: "This run's budget is used, or reserved by its calls in flight: what it has tallied plus this call's prompt and the least answer exceed the run's cap."}

// reserveRunBudget takes this call's share of its named run's cap (see runstate.RunBudget):
// the worst case it asks for, or what the run has left when that is less, and never less than
// its prompt's cost. budget is the run's cap at list price. A call that bounds its output
// neither itself nor through the model's configured limit asks for all that is left, so the
// run's other calls wait for it. A refusal comes with the error behind it, if any, for the
// caller's refusal line.
func (s *Server) reserveRunBudget(ctx context.Context, c *call, budget int64) (int64, *apiError, error) {
	req := c.req
	least := req.boundPrice().Cost(req.promptEstimate())
	want := budget
	if maxOut := req.outputBound(s.cfg.Models[req.priceKey].MaxOutputTokens); maxOut >= 0 {
		want = min(want, req.boundPrice().WorstCase(req.promptEstimate(), min(maxOut, pricing.MaxTokens)))
	}
	want = max(want, least)
	// The run's calls share one hold, so one slot of the user's max_in_flight: without a bound
	// here a caller could run any number of calls at once under one name.
	rctx, cancel := redisStep(ctx)
	s.beforeStep(rctx, stepReserve)
	granted, err := s.budgets.ReserveAtMost(rctx, c.runID, c.callID, budget, want, least, max(c.hold.MaxInFlight, 1), c.hold.RecordedMicro)
	cancel()
	switch {
	case errors.Is(err, runstate.ErrRunBudget):
		return 0, errRunBudget, nil
	case errors.Is(err, runstate.ErrRunCalls):
		return 0, &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "too_many_in_flight",
			Message:    fmt.Sprintf("%d calls of this run are already in flight (limit %d). Retry when one finishes.", c.hold.MaxInFlight, c.hold.MaxInFlight),
			RetryAfter: time.Second}, nil
	case errors.Is(err, runstate.ErrRunClosed):
		return 0, errRunSettled, nil
	case err != nil:
		// The reservation may have been made and its reply lost: the call's release (with
		// nothing used) must still go out.
		c.reserving = true
		if callerEnded(ctx) {
			e, why := ended(ctx, "during the run budget reservation")
			return 0, e, fmt.Errorf("%s: %w", why, err)
		}
		return 0, errBillingDown, fmt.Errorf("run budget unavailable: %w", err)
	}
	c.reserving = true
	return granted, nil, nil
}

// recordRunCall records a call of a named run on the run's row, once (a complete answer's
// before its end reaches the caller, see tallyBeforeAnswer), and pushes the run's expiry out:
// the row records the call as well as the tally, which is lost with a Redis restart.
//
// A record that failed, whether or not it landed (its reply lost, cut by admit_timeout, the
// database out of reach or not taking writes), is left to be sent again with the same
// figures: the row counts a call once however often it is sent (holds.Store.RecordRunCall,
// by the call's id). The call's end tries it until settle_timeout (retryRunCallEnd), and the
// record-to-come mark its tally may have left keeps the run from being settled without it
// meanwhile, until the mark lapses (lease_ttl). Given up, a Redis restart before the run
// settles took the call's one record, its tally, with it.
func (s *Server) recordRunCall(ctx context.Context, c *call, st holds.Settlement) {
	if c.recorded {
		return
	}
	c.recorded = true
	if c.recordAs != nil {
		// Sent again as it was first sent, as its tally (written with it) has it: a row that
		// records more than the tally looks to the run's next reservation like a tally that
		// lost calls.
		st = *c.recordAs
	}
	ectx, cancel := s.storeContext(ctx)
	defer cancel()
	calls := st.Calls
	if st.CostMicro == 0 && st.Usage == (pricing.Usage{}) {
		calls = 0
	}
	live, err := s.store.RecordRunCall(ectx, c.runID, c.callID, s.cfg.Holds.RunTTL, st.Usage, st.CostMicro, calls, st.Estimated)
	switch {
	case err != nil:
		c.recorded = false
		if c.recordAs == nil {
			c.recordAs = &st
			c.log.Warn("run call not recorded; tried again until settle_timeout, counted once however often it lands", zap.Error(err))
		}
		return
	case c.recordAs != nil && !live:
		// Its settlement charged the call from an earlier try that landed unanswered, or from
		// the run's tally, or (both missing) without it.
		c.log.Warn("run call's record, sent again, found its run settled", callFigures(st)...)
	case c.recordAs != nil:
		c.log.Info("run call recorded on a later try")
	}
	if c.recordMarked {
		// Its tally (ReleaseBeforeRecord) kept the run from being settled until now. A tally
		// that failed left no mark, or (its reply lost) one its later try drops (tallyCall). A
		// drop that fails here is not tried again before the caller has its answer, on a Redis
		// that just failed: the call's end tries it again after (retryRunCallEnd).
		rctx, cancel := redisStep(context.WithoutCancel(ctx))
		defer cancel()
		if err := s.budgets.Recorded(rctx, c.runID, c.callID); err != nil {
			c.recordMarkLeft = true
			c.log.Warn("run call's record not marked; tried again until settle_timeout, the run's settle is run_busy until then", zap.Error(err))
		}
	}
}

// recordMarkDropped tries once to drop a call's record-to-come mark, and reports whether it
// did. Left, the mark kept every settle of the run at 409 run_busy, with nothing in flight,
// until it lapsed (the lease TTL, 30 s): after a Redis slowdown the caller's settle, sent once
// Redis answered again, was refused that long. The drop (an HDEL) is safe to repeat.
func (s *Server) recordMarkDropped(ctx context.Context, runID, callID string) bool {
	rctx, cancel := redisStep(ctx)
	defer cancel()
	return s.budgets.Recorded(rctx, runID, callID) == nil
}

// recordMarkRetried logs how the later tries to drop a call's record-to-come mark ended.
func recordMarkRetried(log *zap.Logger, dropped bool) {
	if !dropped {
		log.Warn("run call's record mark never dropped; the run's settle is run_busy until it lapses (lease_ttl)")
		return
	}
	log.Info("run call's record marked on a later try")
}

// settleRoute names the settle route in its log lines.
const settleRoute = "/v1/runs/{id}/settle"

// settleRun answers POST /v1/runs/{id}/settle: the run is charged what its calls tallied.
func (s *Server) settleRun(w http.ResponseWriter, r *http.Request) {
	u := userFrom(r.Context())
	asked := runIDParam(r)
	runID, ok := lookupRunID(u.ID, asked)
	if !ok {
		logRefusal(s.log, errRunNotFound, "no such run", nil, zap.Uint64("user_id", u.ID), zap.String("route", settleRoute),
			zap.String("asked_id", logged(chi.URLParam(r, "id"))))
		writeError(w, errRunNotFound)
		return
	}
	// asked_id beside run_id: a run named by its X-Run-Id has for run_id the gateway's hash of
	// the user and that name, and a settle's answer names no request, so the name the caller
	// settled (lookupRunID's pattern bounds it) is what an operator it quotes can find it by.
	log := s.log.With(zap.String("run_id", runID), zap.Uint64("user_id", u.ID), zap.String("asked_id", asked))
	// A refused settle writes its one line, as a refused call does: the caller's 409 (a run
	// still running) or 404 must be traceable by its run in the log.
	refuse := func(e *apiError, reason string) {
		logRefusal(log, e, reason, nil, zap.String("route", settleRoute))
		writeError(w, e)
	}
	// Counted as a call, so that graceful shutdown waits for it (Drain): it closes the run in
	// Redis and then commits its settlement, and a process that exited between the two left
	// the run closed (its calls answered 409 run_settled) and unsettled until it expired.
	// One that comes once the drain has begun is refused before it closes anything.
	if !s.calls.enter() {
		refuse(errSettleShuttingDown, "shutting down")
		return
	}
	defer s.calls.leave()
	rctx, cancel := s.storeContext(r.Context())
	defer cancel()
	run, err := s.store.Run(rctx, u.ID, runID)
	if errors.Is(err, holds.ErrRunNotFound) {
		refuse(errRunNotFound, "no such run")
		return
	}
	if err != nil {
		logRefusal(log, errSettleRunUnread, "run unreadable", err, zap.String("route", settleRoute))
		writeError(w, errSettleRunUnread)
		return
	}
	if run.State != holds.StateSettled {
		if !run.ClientRunID.Valid {
			// A call's own run settles when the call ends; settling it sooner would charge it
			// only what it had tallied so far, which is nothing.
			refuse(errRunSettlesItself, "a call's own run settles itself")
			return
		}
		st, mark, e := s.finalRunTally(r.Context(), run, log)
		if e != nil {
			if e == errRunBusy {
				refuse(e, "run has calls in flight")
				return
			}
			writeError(w, e) // billing down: finalRunTally logged why
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.Limits.SettleTimeout)
		defer cancel()
		res, err := s.store.Settle(ctx, st)
		if err != nil {
			s.metrics.SettleFailures.Inc()
			log.Error("run settlement failed", zap.Error(err))
			// A settlement whose COMMIT went out unanswered may have settled the run: reopened,
			// a call of it admitted before the close could reserve and run, and never be
			// charged. Closed, its calls are refused until a retried settle finds the run
			// settled or settles it, or until the mark lapses.
			if errors.Is(err, holds.ErrOutcomeUnknown) {
				writeError(w, errSettleUnanswered)
				return
			}
			s.reopenRun(ctx, run.RunID, mark, log)
			writeError(w, errSettleNotDone)
			return
		}
		s.settledOnRequest(st, res, log)
		if run, err = s.store.Run(ctx, u.ID, runID); err != nil {
			log.Error("run settled, reading it back failed", zap.Error(err))
			writeError(w, s.settledUnread(res))
			return
		}
	}
	s.writeRun(w, r, run)
}

// settledUnread answers a settle whose settlement committed and whose read of the run back
// failed: billing_unavailable, as the read's failure is, but saying the run is settled. Told
// that nothing was done, an agent would take its run as still open, or its task as unbilled.
func (s *Server) settledUnread(res holds.Settled) *apiError {
	what := "The run is settled (by an earlier settlement)"
	if res.Applied {
		what = fmt.Sprintf("The run was settled, charged %s credits", s.creditsOf(res.ChargedMicro))
	}
	return &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "billing_unavailable",
		Message:    what + ", but billing became unavailable before it could be read back. GET /v1/runs/{id}, or settle again, to see it.",
		RetryAfter: time.Second}
}

// finalRunTally closes a named run for settlement and reads what it is charged. The run is
// closed first, so no call of it starts after its tally is read, and closing is refused while a
// call runs, whose usage the tally does not have yet.
//
// Every call of a run leaves a tally, even one that used nothing, so none at all means either a
// first call between its admission and its reservation (a run younger than the longest call:
// busy, and not closed, or that call would be refused) or evidence lost with a killed process,
// a failed Redis write or a Redis restart: then, as the reconciler would (DESIGN §5), the run
// is charged what its row recorded, else what it held, what the caller authorised. A run whose
// Redis record lost calls (runRecordLost) is busy until its calls in flight are seen again.
//
// The mark returned is CloseRun's: a caller whose settlement then fails reopens the run with it.
func (s *Server) finalRunTally(ctx context.Context, run holds.Run, log *zap.Logger) (st holds.Settlement, mark string, e *apiError) {
	unavailable := func(what string, err error) (holds.Settlement, string, *apiError) {
		// A refusal with nothing charged, as a call refused for Redis or the database is: WARN,
		// which the logger samples. An ERROR line is never sampled, and a caller settling in a
		// loop while Redis was out wrote one per request at its own rate.
		logRefusal(log, errSettleNotDone, what, err, zap.String("route", settleRoute))
		if mark != "" {
			s.reopenRun(ctx, run.RunID, mark, log)
		}
		return holds.Settlement{}, "", errSettleNotDone
	}
	before, foundBefore, err := s.readTally(ctx, run.RunID)
	if err != nil {
		return unavailable("run tally unreadable", err)
	} else if !foundBefore && run.Age() < s.maxCall() {
		return holds.Settlement{}, "", errRunBusy
	} else if runRecordLost(run, before, foundBefore) {
		// Redis lost calls of the run (a restart without persistence): the reservation of a
		// call in flight went with them, and its lease is back only at its process's next
		// heartbeat. Until then CloseRun would not see that call.
		rctx, cancel := redisStep(ctx)
		err := s.budgets.AwaitRebuild(rctx, run.RunID)
		cancel()
		if errors.Is(err, runstate.ErrRunBusy) {
			log.Warn("run's Redis record lost calls its row records; settling once its calls in flight are seen again")
			return holds.Settlement{}, "", errRunBusy
		} else if err != nil {
			return unavailable("run not settled", err)
		}
	}
	s.beforeStep(ctx, stepRunClose)
	rctx, cancel := redisStep(ctx)
	mark, err = s.budgets.CloseRun(rctx, run.RunID)
	cancel()
	if errors.Is(err, runstate.ErrRunBusy) {
		return holds.Settlement{}, "", errRunBusy
	} else if err != nil {
		// The close may have landed, its reply lost: unavailable reopens the run with its mark.
		return unavailable("run not closed", err)
	}
	t, found, err := s.readTally(ctx, run.RunID)
	if err != nil {
		return unavailable("run tally unreadable", err)
	}
	if foundBefore && (!found || t.Calls < before.Calls) {
		// A tally only grows: this one shrank since the look above, so Redis lost the run's
		// keys in between (a restart without persistence), the reservation of a call in flight
		// with them, and the close did not see that call. Settled now, the run was charged
		// without it, and the call ended on a settled run, charged nothing. Busy, as a settle
		// that finds the loss first is: 409 run_busy with its Retry-After, not errSettleNotDone's
		// 503, though the settle is refused and the run reopened as that one's is. Redis answered
		// every step here: billing is not unavailable, the settle waits for a call in flight
		// whose lease is back at its process's next heartbeat, and a retry settles the run once
		// that call has ended (busy for lease_ttl at most). Told billing_unavailable, an agent
		// would back off as from an outage for what is a wait of seconds. A tally that could not
		// be read at all (above) is the 503.
		log.Warn("run's Redis record lost as it was closed; settling once its calls in flight are seen again")
		s.reopenRun(ctx, run.RunID, mark, log)
		return holds.Settlement{}, "", errRunBusy
	}
	t, found = believableTally(t, found, run.RunID, log)
	// What the run's row recorded of its calls, read now that no call starts: a tally that
	// lost calls (a Redis restart) costs less than the row.
	sctx, cancel := s.storeContext(ctx)
	fresh, err := s.store.Run(sctx, run.UserID, run.RunID)
	cancel()
	if err != nil {
		return unavailable("run unreadable", err)
	}
	// The tally's mark of calls charged an estimate stands whichever record is charged, as the
	// reconciler's does: the row's own mark is kept by the settlement, but a call whose record
	// on the row never landed (retryRunCallEnd gave up) left it there alone.
	estimated := found && t.EstimatedCalls > 0
	if !fresh.RecordBelievable() {
		// Recorded counts it none: settled from, its negative cost panicked the store.
		log.Error("run's row records impossible figures of its calls; read as a run without them — someone should look",
			zap.Int64("row_cost_micro", fresh.CostMicro), zap.Int("row_calls", fresh.Calls))
	}
	if u, cost, calls, rfound := fresh.Recorded(); rfound && (!found || holds.RecordsMore(cost, calls, t.CostMicro, t.Calls)) {
		t, found = runstate.Tallied{Usage: u, CostMicro: cost, Calls: calls}, true
	}
	st = holds.Settlement{RunID: run.RunID, Usage: t.Usage, CostMicro: t.CostMicro, Calls: int(t.Calls), Source: holds.SourceClient,
		Estimated: estimated}
	// The settled row keeps the prices it was billed at (DESIGN §2), as a one-call run's and a
	// reconciled run's do: those of the model the run was admitted with, as the admitting
	// process priced it (recorded on the hold). This process's table, perhaps newer, stands in
	// only for a hold that recorded none.
	if _, priceKey, err := s.prices.Lookup(run.Model); err == nil {
		st.PriceSnapshot, st.SnapshotIfMissing = s.snapshots[priceKey], true
	}
	if !found {
		// Counted and logged by the caller once the settlement has charged it (settledOnRequest).
		st.ChargeHeld, st.Estimated = true, true
	}
	return st, mark, nil
}

// settledOnRequest counts a settlement on request, and a charge of a run's hold (its usage
// lost) with tollgate_reconcile_hold_total and an ERROR line — only once the settlement has
// charged it: a settle that failed, or found the run settled by someone else, charged nothing.
func (s *Server) settledOnRequest(st holds.Settlement, res holds.Settled, log *zap.Logger) {
	s.metrics.Settlements.WithLabelValues(holds.SourceClient, boolString(res.Applied)).Inc()
	if st.ChargeHeld && res.Applied {
		s.metrics.ReconcileHold.Inc()
		log.Error("run settled on request without a tally: charged what it held", zap.Int64("charged_micro", res.ChargedMicro))
	}
}

// readTally reads a run's tally for a caller's request, within redisStepTimeout.
func (s *Server) readTally(ctx context.Context, runID string) (runstate.Tallied, bool, error) {
	ctx, cancel := redisStep(ctx)
	defer cancel()
	return s.tally.Get(ctx, runID)
}

// chargeableTally is the tally of a run to show (GET /v1/runs/{id}), read as a settlement
// reads it (believableTally): as the reconciler reads one, a tally whose figures
// TallyBelievable refuses is none, and the run is charged what its row recorded. Trusted, a
// negative token count was settled as 0 beside the row's record of it.
func (s *Server) chargeableTally(ctx context.Context, runID string, log *zap.Logger) (runstate.Tallied, bool, error) {
	t, found, err := s.readTally(ctx, runID)
	if err != nil {
		return t, found, err
	}
	t, found = believableTally(t, found, runID, log)
	return t, found, nil
}

// believableTally is t, a run's tally as read, or none (found false) when TallyBelievable
// refuses its figures (see chargeableTally).
func believableTally(t runstate.Tallied, found bool, runID string, log *zap.Logger) (runstate.Tallied, bool) {
	if found && !holds.TallyBelievable(t.Usage, t.CostMicro, t.Calls) {
		log.Error("run's tally holds impossible figures; read as a run without one — someone should look",
			zap.String("run_id", runID), zap.Int64("cost_micro", t.CostMicro), zap.Int64("calls", t.Calls),
			zap.Int64("in_tok", t.Usage.Input), zap.Int64("out_tok", t.Usage.Output))
		return runstate.Tallied{}, false
	}
	return t, found
}

// reopenRun lets a run's calls start again after its settlement failed (see
// runstate.RunBudget.ReopenRun). A reopen that fails leaves the run closed until the mark
// expires (the longest call): its calls are refused meanwhile, nothing is charged wrongly.
func (s *Server) reopenRun(ctx context.Context, runID, mark string, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseReleaseTimeout)
	defer cancel()
	if err := s.budgets.ReopenRun(ctx, runID, mark); err != nil {
		log.Warn("run not reopened after its settlement failed; its calls are refused until the mark expires", zap.Error(err))
	}
}

// runRecordLost reports whether Redis has lost calls of a named run that its row recorded (a
// restart without persistence): no tally at all, or one with fewer calls, or costing less, or
// with fewer ended calls. A call is tallied before it is recorded on the row
// (tallyBeforeAnswer, finish), so otherwise the tally has every call the row has. The ended
// calls tell a loss of calls that used nothing (a failed first call) once a call made since
// the restart has tallied as much as the row records: compared by cost and counted calls
// alone, the run was closed past a call in flight whose reservation the restart took, and
// settled without it.
func runRecordLost(run holds.Run, t runstate.Tallied, found bool) bool {
	_, cost, calls, recorded := run.Recorded()
	return recorded && (!found || calls > t.Calls || cost > t.CostMicro || (t.EndedKnown && int64(run.EndedCalls) > t.Ended))
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
