package proxy

import (
	"context"
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
)

var errRunBudget = &apiError{Status: http.StatusPaymentRequired, Type: "insufficient_quota", Code: "run_budget_exhausted",
	Message: "This run has used its budget: the tallied cost plus this call's worst case exceeds the run's cap."}

// runSpent is what a run's earlier calls cost, at the run's discount: the part of its cap
// already used.
func (s *Server) runSpent(ctx context.Context, c *call) (int64, error) {
	t, _, err := s.tally.Get(ctx, c.runID)
	if err != nil {
		return 0, err
	}
	return t.CostMicro, nil
}

// endRunCall closes one call of a caller-named run, whose usage finish has already tallied
// (the run's record until it settles): its lease is dropped and the run's expiry moves out by
// run_ttl.
// A fresh run whose first call never reached the upstream is released at 0: it never started.
func (s *Server) endRunCall(ctx context.Context, c *call, st holds.Settlement) {
	if !c.laterCall && (c.outcome == outcomeRefused || c.outcome == outcomeUpstreamError) {
		s.settlements.Add(1)
		s.settle(ctx, c, st)
		return
	}
	ectx, cancel := s.storeContext(ctx)
	defer cancel()
	if _, err := s.store.Extend(ectx, c.runID, s.cfg.Holds.RunTTL); err != nil {
		c.log.Warn("run expiry not extended", zap.Error(err))
	}
	s.releaseLease(ctx, c)
}

// settleRun answers POST /v1/runs/{id}/settle: the run is charged what its calls tallied.
func (s *Server) settleRun(w http.ResponseWriter, r *http.Request) {
	u := userFrom(r.Context())
	runID, ok := lookupRunID(u.ID, chi.URLParam(r, "id"))
	if !ok {
		writeError(w, errRunNotFound)
		return
	}
	log := s.log.With(zap.String("run_id", runID), zap.Uint64("user_id", u.ID))
	rctx, cancel := s.storeContext(r.Context())
	defer cancel()
	run, err := s.store.Run(rctx, u.ID, runID)
	if errors.Is(err, holds.ErrRunNotFound) {
		writeError(w, errRunNotFound)
		return
	}
	if err != nil {
		log.Error("read run failed", zap.Error(err))
		writeError(w, errBillingDown)
		return
	}
	if run.State != holds.StateSettled {
		t, _, err := s.tally.Get(r.Context(), runID)
		if err != nil {
			log.Error("run tally unreadable; not settling", zap.Error(err))
			writeError(w, errBillingDown)
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.Limits.SettleTimeout)
		defer cancel()
		res, err := s.store.Settle(ctx, holds.Settlement{RunID: runID, Usage: t.Usage, CostMicro: t.CostMicro,
			Calls: int(t.Calls), Source: holds.SourceClient})
		if err != nil {
			log.Error("run settlement failed", zap.Error(err))
			writeError(w, errBillingDown)
			return
		}
		s.metrics.Settlements.WithLabelValues(holds.SourceClient, boolString(res.Applied)).Inc()
		if run, err = s.store.Run(ctx, u.ID, runID); err != nil {
			log.Error("read run failed", zap.Error(err))
			writeError(w, errBillingDown)
			return
		}
	}
	writeJSON(w, http.StatusOK, s.runView(r, run))
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
