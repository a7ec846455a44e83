package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/pricing"
)

// modelsPath lists the priced models; a model's own path is under it.
const modelsPath = "/v1/models"

// listModels answers GET /v1/models with the priced models, in OpenAI's list shape.
func (s *Server) listModels(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{Object: "list", Data: []modelObject{}}
	for _, name := range s.prices.Models() {
		out.Data = append(out.Data, s.modelObject(name))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// retrieveModel answers GET /v1/models/{id} (the SDKs' models.retrieve, which tools call to
// check a model before they use it) for any name a call could be billed under: a configured
// name, or one priced by its prefix (a dated snapshot). The id is the rest of the path, so
// that an open-weight model's "org/name" is one id whether its slash comes escaped (the Go
// and Node SDKs) or not (Python's).
func (s *Server) retrieveModel(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "*")
	if r.URL.RawPath != "" {
		// chi matched the raw path; only then is the parameter still escaped.
		var err error
		if id, err = url.PathUnescape(id); err != nil {
			id = ""
		}
	}
	_, key, err := s.prices.Lookup(id)
	// A name priced by its prefix that every call naming it is refused (checkModelName: too
	// long, not UTF-8, a router's fallback chain; a search variant) is billed under by no call.
	if id == "" || checkModelName(id) != nil || err != nil || premiumVariant(id, key) != "" {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
			Message: fmt.Sprintf("The model %q does not exist or has no price configured.", quotedValue(id))})
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, s.modelObject(id))
}

// modelObject is a model in OpenAI's shape; it is owned by the upstream that serves it.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) modelObject(name string) modelObject {
	owner := "tollgate"
	if up, ok := s.cfg.UpstreamFor(name); ok {
		owner = up.Name
	}
	return modelObject{ID: name, Object: "model", OwnedBy: owner}
}

// credits answers GET /v1/credits.
func (s *Server) credits(w http.ResponseWriter, r *http.Request) {
	u := userFrom(r.Context())
	ctx, cancel := s.storeContext(r.Context())
	defer cancel()
	b, err := s.store.Balance(ctx, u.ID)
	if err != nil {
		logRefusal(s.log, errBillingDown, "balance unreadable", err, zap.Uint64("user_id", u.ID), zap.String("route", r.URL.Path))
		writeError(w, errBillingDown)
		return
	}
	c := s.creditsOf
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{
		"object": "credits", "user": u.Name, "plan": b.Plan, // the plan of these figures, not the key cache's
		"allowance": c(b.AllowanceMicro), "used_today": c(b.UsedTodayMicro), "held": c(b.HeldMicro),
		"spent_in_runs": c(b.SpentInRunsMicro), "prepaid": c(b.PrepaidMicro), "available": c(b.AvailableMicro), "in_flight": b.InFlight,
		"day": b.Day.Format(time.DateOnly),
	})
}

// creditsOf shows micro-USD as credits: an exact decimal (3.412), never a rounded float.
func (s *Server) creditsOf(micro int64) json.Number {
	return json.Number(pricing.FormatCredits(micro, s.creditMicro))
}

// clientRunIDPattern is what a caller may name a run.
var clientRunIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// runIDFor maps a caller's run name to the gateway's run id. Hashing in the user id scopes
// the name to its user: two users naming their runs "task-1" get two runs.
func runIDFor(userID uint64, clientRunID string) string {
	h := sha256.Sum256([]byte(strconv.FormatUint(userID, 10) + "\x00" + clientRunID))
	return "x_" + hex.EncodeToString(h[:20])
}

// gatewayRunIDPattern is the shape of the gateway's own run ids: r_ + 32 hex for a call's
// run (newRunID, idempotentRunID), x_ + 40 hex for a named run (runIDFor). A caller may not name
// a run so, or looking it up by name would find the id instead.
var gatewayRunIDPattern = regexp.MustCompile(`^(r_[0-9a-f]{32}|x_[0-9a-f]{40})$`)

// lookupRunID resolves a path id: the gateway's own run id (as returned in X-Tollgate-Run-Id,
// for a call's run or a named run) or the caller's X-Run-Id name. The store scopes either to
// its user.
func lookupRunID(userID uint64, id string) (string, bool) {
	if !clientRunIDPattern.MatchString(id) {
		return "", false
	}
	if gatewayRunIDPattern.MatchString(id) {
		return id, true
	}
	return runIDFor(userID, id), true
}

// runIDParam is the {id} of a /v1/runs path as the caller named it. chi matches the raw path
// when the request escaped it: a name holding ':' sent as %3A (encodeURIComponent, Python's
// quote with safe="") reached lookupRunID escaped, and its run was 404.
func runIDParam(r *http.Request) string {
	id := chi.URLParam(r, "id")
	if r.URL.RawPath != "" {
		if unescaped, err := url.PathUnescape(id); err == nil {
			return unescaped
		}
		return "" // no name: lookupRunID refuses it
	}
	return id
}

// getRun answers GET /v1/runs/{id}. Another user's run is 404, the same as no run at all.
func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	u := userFrom(r.Context())
	runID, ok := lookupRunID(u.ID, runIDParam(r))
	if !ok {
		writeError(w, errRunNotFound)
		return
	}
	ctx, cancel := s.storeContext(r.Context())
	defer cancel()
	run, err := s.store.Run(ctx, u.ID, runID)
	if errors.Is(err, holds.ErrRunNotFound) {
		writeError(w, errRunNotFound)
		return
	}
	if err != nil {
		logRefusal(s.log, errBillingDown, "run unreadable", err, zap.String("run_id", runID), zap.Uint64("user_id", u.ID),
			zap.String("route", r.URL.Path))
		writeError(w, errBillingDown)
		return
	}
	s.writeRun(w, r, run)
}

// writeRun answers with run as its owner sees it, or 503 billing_unavailable when it is live
// and its tally cannot be read: a live run shown without its calls' usage would read as a run
// that has used nothing.
func (s *Server) writeRun(w http.ResponseWriter, r *http.Request, run holds.Run) {
	view, err := s.runView(r, run)
	if err != nil {
		logRefusal(s.log, errBillingDown, "run tally unreadable", err, zap.String("run_id", run.RunID),
			zap.Uint64("user_id", run.UserID), zap.String("route", r.URL.Path))
		writeError(w, errBillingDown)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, view)
}

// runView is a run as its owner sees it: live runs show their tally, settled ones the charge.
func (s *Server) runView(r *http.Request, run holds.Run) (map[string]any, error) {
	c := s.creditsOf
	view := map[string]any{
		"object": "run", "id": run.RunID, "state": run.State, "held": c(run.HeldMicro), "cap": c(run.CapMicro),
		"model": run.Model, "created_at": run.CreatedAt, "expires_at": run.ExpiresAt,
	}
	if run.ClientRunID.Valid {
		view["name"] = run.ClientRunID.String
	}
	usage := run.Usage().RunCounts(int64(run.Calls))
	if run.State == holds.StateSettled {
		view["charged"] = c(run.ChargedMicro)
		view["cost"] = c(run.CostMicro)
		view["estimated"] = run.Estimated
		view["settle_source"] = run.SettleSource.String
		view["settled_at"] = run.SettledAt.Time
	} else if t, found, err := s.chargeableTally(r.Context(), run.RunID, s.log); err != nil {
		return nil, fmt.Errorf("tally of run %s: %w", run.RunID, err)
	} else if found {
		// The row's record of ended calls, when it records more (a tally that lost calls to a
		// Redis restart), is what a settlement would charge: show that, as it does.
		if ru, rc, rn, rfound := run.Recorded(); rfound && holds.RecordsMore(rc, rn, t.CostMicro, t.Calls) {
			t.Usage, t.CostMicro, t.Calls = ru, rc, rn
		}
		usage = t.Usage.RunCounts(t.Calls)
		view["tallied_cost"] = c(t.CostMicro)
	} else if _, rc, _, rfound := run.Recorded(); rfound {
		view["tallied_cost"] = c(rc)
	}
	view["usage"] = usage
	return view, nil
}
