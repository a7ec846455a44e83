// Package admin is tollgate's operator API, mounted at /admin: users, keys, grants, balances,
// runs and usage reports — the same operations as the gateway's subcommands.
//
// It authenticates with its own token, never with a user's API key, compared in constant
// time. With no token configured it answers 404 to everything: an admin API that anyone
// could reach because a setting was left empty must not exist.
//
// It imports holds and pricing only; cmd wires it into the proxy's router, so proxy never
// depends on it and it never depends on proxy.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// Limits of what a request may ask for.
const (
	maxBodyBytes     = 64 << 10
	defaultListLimit = 100
	// MaxListLimit bounds a listing's page, here and in the gateway's subcommands.
	MaxListLimit = 1000
)

type handler struct {
	store       *holds.Store
	views       Views
	tokenHash   [32]byte
	log         *zap.Logger
	authEnabled bool
	// reports holds a slot for each usage report being built (at most maxReportsAtOnce).
	reports chan struct{}
}

// maxReportsAtOnce bounds the usage reports built at once: one of 100 000 rows allocates a few
// hundred MB in the gateway's own process, beside the calls it meters.
const maxReportsAtOnce = 2

// reportRetryAfter is what a report refused for the bound tells the operator to wait.
const reportRetryAfter = 5 * time.Second

// requestTimeout bounds one admin request, its database reads and writes included.
const requestTimeout = 60 * time.Second

// New builds the admin handler. Routes are relative to where it is mounted (/admin).
// creditMicro converts micro-USD to the credits every answer shows; token is the bearer
// token an operator must send (empty: the API is disabled and answers 404).
func New(store *holds.Store, creditMicro int64, token string, log *zap.Logger) http.Handler {
	if creditMicro <= 0 {
		panic("admin: credit_micro must be positive")
	}
	h := &handler{store: store, views: Views{CreditMicro: creditMicro}, log: log,
		authEnabled: token != "", reports: make(chan struct{}, maxReportsAtOnce)}
	// Hashing both sides gives equal-length inputs to the constant-time compare, so neither
	// the content nor the length of the token leaks through timing.
	h.tokenHash = sha256.Sum256([]byte(token))

	r := chi.NewRouter()
	// GetHead: a HEAD is answered as the GET it probes, as on the gateway's own routes.
	r.Use(h.auth, middleware.GetHead)
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) { writeError(w, errNoRoute) })
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Allow", strings.Join(allowedMethods(r, req), ", "))
		writeError(w, errMethod)
	})

	// Every route is registered flat, with its whole pattern, never under r.Route: a sub-router
	// is mounted on its own path for every method, so allowedMethods would find each method
	// "allowed" on /users/{name} itself.
	r.Get("/users", h.listUsers)
	r.Post("/users", h.createUser)
	r.Get("/users/{name}", h.getUser)
	r.Patch("/users/{name}", h.patchUser)
	r.Post("/users/{name}/disable", h.disableUser)
	r.Post("/users/{name}/enable", h.enableUser)
	r.Get("/users/{name}/keys", h.listKeys)
	r.Post("/users/{name}/keys", h.createKey)
	r.Post("/users/{name}/keys/revoke", h.revokeUserKeys)
	r.Get("/users/{name}/grants", h.listGrants)
	r.Post("/users/{name}/grants", h.createGrant)
	r.Get("/users/{name}/balance", h.balance)
	r.Post("/keys/revoke", h.revokeKey)
	r.Get("/runs", h.listRuns)
	r.Get("/reports/usage", h.usageReport)
	return r
}

// allowedMethods lists the methods r serves on req's path, for the Allow header of a 405
// (RFC 9110 requires it). chi hands a custom 405 handler no such list, so each method is tried
// against the router again. The path is the one r routes on: what is left of it below the
// mount point (/admin), escaped as chi saw it.
func allowedMethods(r *chi.Mux, req *http.Request) []string {
	path := ""
	if rctx := chi.RouteContext(req.Context()); rctx != nil {
		path = rctx.RoutePath
	}
	if path == "" {
		path = req.URL.Path
		if req.URL.RawPath != "" {
			path = req.URL.RawPath
		}
	}
	var out []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if r.Match(chi.NewRouteContext(), m, path) {
			out = append(out, m)
			if m == http.MethodGet {
				out = append(out, http.MethodHead) // answered as the GET (middleware.GetHead)
			}
		}
	}
	return out
}

// auth lets through only requests that carry the admin token. A user's API key is just a
// wrong token here: 401, and the request goes no further.
func (h *handler) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.authEnabled {
			writeError(w, errDisabled)
			return
		}
		got, ok := bearer(r)
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], h.tokenHash[:]) != 1 {
			h.log.Warn("admin request refused: bad token", zap.String("method", r.Method),
				zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr))
			writeError(w, errBadToken)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		// The store retries an unreachable database until its context ends, and an admin
		// request's own context ends only when its client gives up.
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func bearer(r *http.Request) (string, bool) {
	v := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(v) <= len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(v[len(prefix):]), true
}

// --- users ---

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
	writeJSON(w, http.StatusOK, List(users, limit, h.views.User, func(u holds.UserDetail) any { return u.Name }))
}

func (h *handler) createUser(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
		Plan string `json:"plan"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.Plan == "" {
		req.Plan = "standard"
	}
	// The store refuses a name it does not accept (400 invalid_name) before it looks at the
	// plan, so the gateway's `user create` and this answer cannot drift apart.
	if _, err := h.store.CreateUser(r.Context(), req.Name, req.Plan); err != nil {
		if errors.Is(err, holds.ErrUnknownPlan) {
			writeError(w, h.unknownPlan(req.Plan))
			return
		}
		h.fail(w, r, err)
		return
	}
	h.log.Info("admin: user created", zap.String("user", req.Name), zap.String("plan", req.Plan))
	d, err := h.store.UserDetail(r.Context(), req.Name)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, h.views.User(d))
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

func (h *handler) getUser(w http.ResponseWriter, r *http.Request) {
	if d, ok := h.user(w, r); ok {
		writeJSON(w, http.StatusOK, h.views.User(d))
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
			var n json.Number // a number, or a string holding one
			if err := json.Unmarshal([]byte(raw), &n); err != nil {
				return 0, false
			}
			m, err := pricing.ParseCredits(n.String(), h.views.CreditMicro)
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
	h.log.Info("admin: user changed", zap.String("user", d.Name), zap.Any("change", c))
	d, err := h.store.UserDetail(r.Context(), d.Name)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, h.views.User(d))
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

func (h *handler) disableUser(w http.ResponseWriter, r *http.Request) { h.setDisabled(w, r, true) }
func (h *handler) enableUser(w http.ResponseWriter, r *http.Request)  { h.setDisabled(w, r, false) }

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
	writeJSON(w, http.StatusOK, v)
}

// --- keys ---

func (h *handler) listKeys(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	limit, bad := limitParam(r)
	if bad != nil {
		writeError(w, bad)
		return
	}
	after, bad := idParam(r, "a key id")
	if bad != nil {
		writeError(w, bad)
		return
	}
	keys, err := h.store.ListKeys(r.Context(), d.ID, after, limit+1)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, List(keys, limit, h.views.Key, func(k holds.KeyInfo) any { return k.ID }))
}

// createKey issues a key and shows it this once: only its hash is stored.
func (h *handler) createKey(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	key, err := h.store.CreateKey(r.Context(), d.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.log.Info("admin: key created", zap.String("user", d.Name), zap.String("prefix", holds.ShownPrefix(key)))
	writeJSON(w, http.StatusCreated, map[string]any{"object": "api_key", "user": d.Name, "key": key, "prefix": holds.ShownPrefix(key),
		"note": "This is the only time the key is shown; store it now."})
}

// revokeKey revokes the key given in full. Refused at once by the store; a proxy that looked
// the key up in the last key_cache_ttl (2 s by default) may still accept it until its cached
// entry ends.
func (h *handler) revokeKey(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Key string `json:"key"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.Key == "" {
		writeError(w, badRequest("missing_key", "send {\"key\": \"tg_...\"}"))
		return
	}
	user, err := h.store.RevokeAPIKey(r.Context(), req.Key)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "api_key", "revoked": true, "user": user, "prefix": holds.ShownPrefix(req.Key)})
}

// revokeUserKeys revokes a user's keys by the prefix lists show, for when the key is lost.
func (h *handler) revokeUserKeys(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	var req struct {
		Prefix string `json:"prefix"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	n, err := h.store.RevokeKeysByPrefix(r.Context(), d.ID, req.Prefix)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "api_key", "user": d.Name, "prefix": req.Prefix, "revoked": n})
}

// --- grants and balance ---

func (h *handler) listGrants(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	limit, bad := limitParam(r)
	if bad != nil {
		writeError(w, bad)
		return
	}
	after, bad := idParam(r, "a grant id")
	if bad != nil {
		writeError(w, bad)
		return
	}
	grants, err := h.store.Grants(r.Context(), d.ID, after, limit+1)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, List(grants, limit, func(g holds.Grant) map[string]any { return h.views.Grant(d.Name, g, false) },
		func(g holds.Grant) any { return g.ID }))
}

// createGrant credits (or, with a negative amount, debits) prepaid credits once per
// idempotency key: 201 when this request created the grant, 200 with the original grant for
// a repeat. The key may come in the body or, as payment webhooks often send it, in the
// Idempotency-Key header.
func (h *handler) createGrant(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	var req struct {
		Amount         json.Number `json:"amount"` // credits, decimal; negative for a refund
		IdempotencyKey string      `json:"idempotency_key"`
		Reason         string      `json:"reason"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = r.Header.Get("Idempotency-Key")
	}
	// encoding/json decodes bytes that are not UTF-8, and escaped unpaired surrogates, to
	// U+FFFD without an error: two different keys would arrive as one, and the second payment
	// would be answered as a replay of the first, never credited. Keys are compared byte for
	// byte, so one that cannot be told apart from another is refused.
	if strings.ContainsRune(req.IdempotencyKey, utf8.RuneError) {
		writeError(w, badRequest("invalid_request", "idempotency_key must be UTF-8 text without U+FFFD (what bytes that are not UTF-8, or unpaired surrogates, decode to): two different keys would be one grant"))
		return
	}
	amount, err := pricing.ParseCredits(req.Amount.String(), h.views.CreditMicro)
	if err != nil {
		writeError(w, badRequest("invalid_amount", "amount must be a decimal number of credits, e.g. \"12.5\" or \"-3\": "+err.Error()))
		return
	}
	g, created, err := h.store.Grant(r.Context(), holds.GrantRequest{UserID: d.ID, AmountMicro: amount,
		IdempotencyKey: req.IdempotencyKey, Reason: req.Reason})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, h.views.Grant(d.Name, g, !created))
}

func (h *handler) balance(w http.ResponseWriter, r *http.Request) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	b, err := h.store.Balance(r.Context(), d.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, h.views.Balance(d, b))
}

// --- runs and reports ---

func (h *handler) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := holds.RunFilter{State: holds.State(q.Get("state")), After: q.Get("after")}
	var bad *apiError
	if f.Limit, bad = limitParam(r); bad != nil {
		writeError(w, bad)
		return
	}
	var err error
	if f.Since, err = ParseTime(q.Get("since")); err != nil {
		writeError(w, badRequest("invalid_since", err.Error()))
		return
	}
	if f.Until, err = ParseTime(q.Get("until")); err != nil {
		writeError(w, badRequest("invalid_until", err.Error()))
		return
	}
	if f.SettledSince, err = ParseTime(q.Get("settled_since")); err != nil {
		writeError(w, badRequest("invalid_settled_since", err.Error()))
		return
	}
	if f.SettledUntil, err = ParseTime(q.Get("settled_until")); err != nil {
		writeError(w, badRequest("invalid_settled_until", err.Error()))
		return
	}
	if name := q.Get("user"); name != "" {
		d, err := h.store.UserDetail(r.Context(), name)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		f.UserID = d.ID
	}
	limit := f.Limit
	f.Limit++ // one more: whether it comes is has_more
	runs, err := h.store.ListRuns(r.Context(), f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// The cursor of the next page: ?after=<last_id>, with the same filters. It holds the last
	// run's position, so the run may be pruned before the next page is asked for.
	writeJSON(w, http.StatusOK, List(runs, limit, h.views.Run, func(run holds.UserRun) any { return f.Cursor(run.Run) }))
}

// usageReport answers GET /reports/usage?from=YYYY-MM-DD&to=YYYY-MM-DD[&user=][&format=csv].
// Days are UTC days of settlement, as in the day ledger; both ends are inclusive and default
// to today by the database's clock, the ledger's.
func (h *handler) usageReport(w http.ResponseWriter, r *http.Request) {
	select {
	case h.reports <- struct{}{}:
		defer func() { <-h.reports }()
	default:
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "reports_busy",
			Message: fmt.Sprintf("%d usage reports are being built; retry shortly.", maxReportsAtOnce), RetryAfter: reportRetryAfter})
		return
	}
	q := r.URL.Query()
	var today time.Time
	if q.Get("from") == "" || q.Get("to") == "" {
		var err error
		if today, err = h.store.Today(r.Context()); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	from, err := dateParam(q.Get("from"), today)
	if err != nil {
		writeError(w, badRequest("invalid_from", err.Error()))
		return
	}
	to, err := dateParam(q.Get("to"), today)
	if err != nil {
		writeError(w, badRequest("invalid_to", err.Error()))
		return
	}
	format := q.Get("format")
	if format != "" && format != "json" && format != "csv" {
		writeError(w, badRequest("invalid_format", "format must be json or csv"))
		return
	}
	var userID uint64
	if name := q.Get("user"); name != "" {
		d, err := h.store.UserDetail(r.Context(), name)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		userID = d.ID
	}
	rep, err := h.store.Usage(r.Context(), from, to, userID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if format == "csv" {
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=\"usage_%s_%s.csv\"", rep.From, rep.To))
		w.WriteHeader(http.StatusOK)
		if err := h.views.WriteReportCSV(w, rep); err != nil {
			h.log.Warn("admin: writing CSV report", zap.Error(err))
		}
		return
	}
	writeJSON(w, http.StatusOK, h.views.Report(rep))
}

// --- parameters and bodies ---

func limitParam(r *http.Request) (int, *apiError) {
	s := r.URL.Query().Get("limit")
	if s == "" {
		return defaultListLimit, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxListLimit {
		return 0, badRequest("invalid_limit", fmt.Sprintf("limit must be 1-%d", MaxListLimit))
	}
	return n, nil
}

// idParam reads the after parameter of a listing paged by a numeric id (0: from the start).
// what names the id in the answer that refuses it.
func idParam(r *http.Request, what string) (uint64, *apiError) {
	s := r.URL.Query().Get("after")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, badRequest("invalid_after", "after must be the last_id of the previous page ("+what+")")
	}
	return n, nil
}

// ParseTime reads an RFC 3339 time or a UTC date (its midnight); "" is the zero time. The
// API's since/until parameters and the CLI's -since/-until flags both take it.
func ParseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a YYYY-MM-DD date", s)
	}
	return t, nil
}

// dateParam reads a YYYY-MM-DD day; "" is def.
func dateParam(s string, def time.Time) (time.Time, error) {
	if s == "" {
		return def, nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not a YYYY-MM-DD date", s)
	}
	return t, nil
}

// readJSON decodes a bounded body strictly: unknown fields are refused, so a misspelt field
// ("ammount") fails loudly instead of granting nothing. On failure it has answered.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Code: "body_too_large", Message: fmt.Sprintf("Request body over %d bytes.", maxBodyBytes)})
			return false
		}
		writeError(w, badRequest("invalid_json", "request body is not the expected JSON: "+err.Error()))
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, badRequest("invalid_json", "request body has data after the JSON object"))
		return false
	}
	return true
}

// fail answers a store error: refusals map to their 4xx, an unreachable database to 503,
// anything else to 500 with the detail in the log only.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := classify(err)
	var below *holds.GrantBelowZeroError
	if errors.As(err, &below) {
		// The store's figures are micro-USD; the request was in credits.
		e.Message = strings.TrimSuffix(e.Message, ".") + ": " + h.views.GrantBelowZero(below)
	}
	if e.Status >= 500 {
		h.log.Error("admin request failed", zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Error(err))
	} else {
		h.log.Info("admin request refused", zap.String("method", r.Method), zap.String("path", r.URL.Path),
			zap.String("code", e.Code), zap.Error(err))
	}
	writeError(w, e)
}

func classify(err error) *apiError {
	switch {
	case errors.Is(err, holds.ErrUnknownUser):
		return errUserNotFound
	case errors.Is(err, holds.ErrInvalidName):
		return badRequest("invalid_name", holds.UserNameRule)
	case errors.Is(err, holds.ErrUserExists):
		return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "user_exists", Message: "A user of that name exists."}
	case errors.Is(err, holds.ErrUnknownPlan):
		return badRequest("unknown_plan", err.Error())
	case errors.Is(err, holds.ErrBadAfter):
		return badRequest("invalid_after", "after must be the last_id of a previous page of this listing: "+err.Error())
	case errors.Is(err, holds.ErrGrantInvalid), errors.Is(err, holds.ErrBadFilter):
		return badRequest("invalid_request", err.Error())
	case errors.Is(err, holds.ErrGrantBelowZero):
		return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "grant_below_zero",
			Message: "A negative grant may not take prepaid credits below zero, nor below what calls in flight hold."}
	case errors.Is(err, holds.ErrGrantKeyReused):
		return &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused",
			Message: "This idempotency key was used for a different grant (another user or amount): " + err.Error()}
	case errors.Is(err, holds.ErrKeyNotFound):
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "key_not_found", Message: "No live key matches."}
	case holds.IsUnavailable(err), holds.IsBusy(err):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "billing_unavailable",
			Message: "The billing database is unreachable or too busy to answer now. Retry shortly.", RetryAfter: time.Second}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: "api_error", Code: "internal_error", Message: "Internal error; see the gateway log."}
}
