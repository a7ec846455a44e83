package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/pricing"
	"go.uber.org/zap"
)

func (h *handler) listUsers(w http.ResponseWriter, r *http.Request) {
	limit, bad := limitParam(r)
	if bad != nil {
		writeError(w, bad)
		return
	}
	users, err := h.store.ListUsers(r.Context(), r.URL.Query().Get("after"), limit+1)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, List(users, limit, h.views.User, func(u holds.UserDetail) any { return u.Name }))
}

func (h *handler) createUser(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
		Plan string `json:"plan"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	// The store refuses a name it does not accept (400 invalid_name) before it looks at the
	// plan, so the gateway's `user create` and this answer cannot drift apart.
	u, err := h.store.CreateUser(r.Context(), req.Name, req.Plan)
	if err != nil {
		if errors.Is(err, holds.ErrUnknownPlan) {
			writeError(w, h.unknownPlan(req.Plan))
			return
		}
		h.fail(w, r, err)
		return
	}
	h.log.Info("admin: user created", zap.String("user", u.Name), zap.String("plan", u.Plan)) // the default plan's name, if none was asked
	d, err := h.store.UserDetail(r.Context(), req.Name)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, h.views.User(d))
}

func (h *handler) getUser(w http.ResponseWriter, r *http.Request) {
	if d, ok := h.user(w, r); ok {
		httpapi.WriteJSON(w, http.StatusOK, h.views.User(d))
	}
}

// patchUser changes a user's plan and per-user overrides. Each applies from the user's next
// admission; holds already taken keep the terms they were admitted with.
func (h *handler) patchUser(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	// A field absent leaves it; null on an override drops it, so the plan's figure applies.
	var req struct {
		Plan        *string         `json:"plan"`
		Allowance   json.RawMessage `json:"allowance"` // credits per UTC day
		MaxInFlight json.RawMessage `json:"max_in_flight"`
		DiscountBP  json.RawMessage `json:"discount_bp"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	var c holds.UserChange
	if req.Plan != nil {
		if !h.store.HasPlan(*req.Plan) {
			writeError(w, h.unknownPlan(*req.Plan))
			return
		}
		c.Plan = *req.Plan
	}
	if c.Allowance, ok = override(w, req.Allowance, "invalid_allowance",
		"allowance must be a non-negative number of credits in steps of "+pricing.FormatCredits(1, h.views.CreditMicro)+", or null",
		func(raw string) (int64, bool) {
			m, err := parseAmount(json.RawMessage(raw), h.views.CreditMicro)
			return m, err == nil && m >= 0
		}); !ok {
		return
	}
	if c.MaxInFlight, ok = override(w, req.MaxInFlight, "invalid_max_in_flight", "max_in_flight must be 1-10000 (disable the user to stop all calls), or null",
		intWithin(1, 10_000)); !ok {
		return
	}
	if c.DiscountBP, ok = override(w, req.DiscountBP, "invalid_discount", "discount_bp must be 0-10000 basis points, or null",
		intWithin(0, 10_000)); !ok {
		return
	}
	if err := h.store.ChangeUser(r.Context(), d.ID, c); err != nil {
		h.fail(w, r, err)
		return
	}
	if c != (holds.UserChange{}) {
		// A PATCH that names no field changes nothing: logged as a change, the audit trail
		// showed one that never happened.
		h.log.Info("admin: user changed", zap.String("user", d.Name), zap.Any("change", c))
	}
	d, err := h.store.UserDetail(r.Context(), d.Name)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, h.views.User(d))
}

func (h *handler) disableUser(w http.ResponseWriter, r *http.Request) { h.setDisabled(w, r, true) }

func (h *handler) enableUser(w http.ResponseWriter, r *http.Request) { h.setDisabled(w, r, false) }

// setDisabled is idempotent: disabling a disabled user answers 200 with changed=false.
func (h *handler) setDisabled(w http.ResponseWriter, r *http.Request, disable bool) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	op := h.store.EnableUser
	if disable {
		op = h.store.DisableUser
	}
	changed, err := op(r.Context(), d.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.log.Info("admin: user disabled state set", zap.String("user", d.Name), zap.Bool("disabled", disable), zap.Bool("changed", changed))
	if d, err = h.store.UserDetail(r.Context(), d.Name); err != nil {
		h.fail(w, r, err)
		return
	}
	v := h.views.User(d)
	v["changed"] = changed
	httpapi.WriteJSON(w, http.StatusOK, v)
}

// unknownPlan refuses a plan that is not configured, naming those that are.
func (h *handler) unknownPlan(plan string) *apiError {
	return badRequest("unknown_plan", fmt.Sprintf("unknown plan %q; configured: %s", plan, strings.Join(h.store.PlanNames(), ", ")))
}

// user resolves the {name} path parameter; on failure it has answered.
func (h *handler) user(w http.ResponseWriter, r *http.Request) (holds.UserDetail, bool) {
	// chi matched on the raw path only if the request had one that differs from its decoded
	// form (an escaped slash); only then is the parameter still escaped. Decoding an already
	// decoded name would turn a user "a%41" into "aA".
	name, err := chi.URLParam(r, "name"), error(nil)
	if r.URL.RawPath != "" {
		name, err = url.PathUnescape(name)
	}
	if err != nil || name == "" {
		writeError(w, errUserNotFound)
		return holds.UserDetail{}, false
	}
	d, err := h.store.UserDetail(r.Context(), name)
	if err != nil {
		h.fail(w, r, err)
		return holds.UserDetail{}, false
	}
	return d, true
}

// override reads one override of a PATCH: absent leaves it, null clears it, else parse must
// accept its raw JSON text. It answers 400 itself when it does not.
func override[T any](w http.ResponseWriter, raw json.RawMessage, code, msg string, parse func(string) (T, bool)) (holds.Override[T], bool) {
	switch {
	case raw == nil:
		return holds.Override[T]{}, true
	case string(raw) == "null":
		return holds.Override[T]{Clear: true}, true
	}
	v, ok := parse(string(raw))
	if !ok {
		writeError(w, badRequest(code, msg))
		return holds.Override[T]{}, false
	}
	return holds.SetTo(v), true
}

// intWithin parses a JSON integer in [lo, hi].
func intWithin(lo, hi int) func(string) (int, bool) {
	return func(raw string) (int, bool) {
		n, err := strconv.Atoi(raw)
		return n, err == nil && n >= lo && n <= hi
	}
}
