// Package admin is tollgate's operator API, mounted at /admin: users, keys, grants, balances,
// runs, usage reports and the gateway processes' rows — the same operations as the gateway's
// subcommands.
//
// It authenticates with its own token, never with a user's API key, compared in constant
// time. With no token configured it answers 404 to everything: an admin API that anyone
// could reach because a setting was left empty must not exist.
//
// It imports holds, pricing and internal/httpapi (the answers' shape it shares with the proxy)
// only; cmd wires it into the proxy's router, so proxy never depends on it and it never
// depends on proxy.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
)

// Limits of what a request may ask for.
const (
	maxBodyBytes     = 64 << 10
	defaultListLimit = 100
	// MaxListLimit bounds a listing's page, here and in the gateway's subcommands.
	MaxListLimit = 1000
)

// maxReportsAtOnce bounds the usage reports built at once: one of 100 000 rows allocates a few
// hundred MB in the gateway's own process, beside the calls it meters.
const maxReportsAtOnce = 2

// reportRetryAfter is what a report refused for the bound tells the operator to wait.
const reportRetryAfter = 5 * time.Second

// outOfRoomRetryAfter is what a write the database refused for want of room on its disk until
// the request's deadline (holds.IsOutOfRoom) tells the operator to wait: freeing room takes
// someone minutes, and a script retrying each second only adds to the retry log.
const outOfRoomRetryAfter = 30 * time.Second

// requestTimeout bounds one admin request, its database reads and writes included: a write
// the database refuses for the moment (unreachable, read_only, its disk full) is tried again until it ends,
// then answered 503. A variable for tests (SetRequestTimeout).
var requestTimeout = 60 * time.Second

type handler struct {
	store       *holds.Store
	views       Views
	tokenHash   [32]byte
	log         *zap.Logger
	authEnabled bool
	// reports holds a slot for each usage report being built (at most maxReportsAtOnce).
	reports chan struct{}
}

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
	r.Get("/users", takes(h.listUsers, "limit", "after"))
	// Writes take their input in the body alone, and those with none take no body: what a
	// write does not read (PATCH /users/bob?plan=guest, a key asked for with an expiry) is
	// refused, not answered as done.
	r.Post("/users", takes(h.createUser))
	r.Get("/users/{name}", takes(h.getUser))
	r.Patch("/users/{name}", takes(h.patchUser))
	r.Post("/users/{name}/disable", takes(noBody(h.disableUser)))
	r.Post("/users/{name}/enable", takes(noBody(h.enableUser)))
	r.Get("/users/{name}/keys", takes(h.listKeys, "limit", "after"))
	r.Post("/users/{name}/keys", takes(noBody(h.createKey)))
	r.Post("/users/{name}/keys/revoke", takes(h.revokeUserKeys))
	r.Get("/users/{name}/grants", takes(h.listGrants, "limit", "after"))
	r.Post("/users/{name}/grants", takes(h.createGrant))
	r.Get("/users/{name}/balance", takes(h.balance))
	r.Post("/keys/revoke", takes(h.revokeKey))
	r.Get("/runs", takes(h.listRuns, "user", "state", "since", "until", "settled_since", "settled_until", "after", "limit"))
	r.Get("/instances", takes(h.listInstances, "limit", "after"))
	r.Get("/reports/usage", takes(h.usageReport, "from", "to", "user", "format"))
	return r
}

// allowedMethods lists the methods r serves on req's path (httpapi.AllowedMethods). The path is
// the one r routes on: what is left of it below the mount point (/admin), escaped as chi saw it.
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
	return httpapi.AllowedMethods(func(m string) bool { return r.Match(chi.NewRouteContext(), m, path) })
}

// auth lets through only requests that carry the admin token. A user's API key is just a
// wrong token here: 401, and the request goes no further.
func (h *handler) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.authEnabled {
			writeError(w, errDisabled)
			return
		}
		if len(r.Header.Values("Authorization")) > 1 {
			// Not a list (RFC 9110 §5.3): read as its first line, the token was taken from
			// whichever line came first. Refused as a query parameter given twice is.
			h.log.Warn("admin request refused: Authorization sent twice", zap.String("method", r.Method),
				zap.String("path", quoted(r.URL.Path)), zap.String("remote", r.RemoteAddr))
			writeError(w, badRequest("invalid_request", "Authorization must be sent once: this request sends it on more than one line."))
			return
		}
		got, ok := httpapi.BearerCredentials(r.Header.Get("Authorization"))
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], h.tokenHash[:]) != 1 {
			h.log.Warn("admin request refused: bad token", zap.String("method", r.Method),
				zap.String("path", quoted(r.URL.Path)), zap.String("remote", r.RemoteAddr))
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

// fail answers a store error: refusals map to their 4xx, an unreachable database to 503,
// anything else to 500 with the detail in the log only.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := classify(err)
	var below *holds.GrantBelowZeroError
	if errors.As(err, &below) {
		// The store's figures are micro-USD; the request was in credits. A copy: classify
		// may answer with an error shared by every request.
		worded := *e
		worded.Message = strings.TrimSuffix(e.Message, ".") + ": " + h.views.GrantBelowZero(below)
		e = &worded
	}
	// The status and code answered, as a refused model call's line names them: a 500 (a bug,
	// someone should look) is told from a 503 (the database out, the caller retries) by them.
	answered := []zap.Field{zap.String("method", r.Method), zap.String("path", quoted(r.URL.Path)),
		zap.Int("status", e.Status), zap.String("code", e.Code)}
	if e.Status >= 500 {
		h.log.Error("admin request failed", append(answered, zap.Error(err))...)
	} else {
		h.log.Info("admin request refused", append(answered, zap.String("error", quoted(err.Error())))...)
	}
	writeError(w, e)
}

// maxLoggedBytes bounds what a log line quotes of what a request sent (its path, a refusal's
// error naming it): the path reaches the log before the token is checked, and a stranger's
// 64 KiB path made a 64 KiB line. The gateway's own routes quote the same 512 bytes.
const maxLoggedBytes = 512

// quoted is the start of s a log line quotes (maxLoggedBytes).
func quoted(s string) string { return s[:min(len(s), maxLoggedBytes)] }

func classify(err error) *apiError {
	switch {
	case errors.Is(err, holds.ErrUnknownUser):
		return errUserNotFound
	case errors.Is(err, holds.ErrInvalidName):
		return badRequest("invalid_name", holds.UserNameRule)
	case errors.Is(err, holds.ErrUserExists):
		msg := "A user of that name exists."
		if ue := (*holds.UserExistsError)(nil); errors.As(err, &ue) && ue.Taken != ue.Name {
			msg = fmt.Sprintf("A user of that name exists: %q (names are compared without regard to case).", ue.Taken)
		}
		return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "user_exists", Message: msg}
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
	case holds.IsOutOfRoom(err):
		// Before IsUnavailable, which a refusal waited out within the store also is: room comes
		// back when an operator frees it, not in the second an outage's answer asks to wait.
		return &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "billing_unavailable",
			Message: "The billing database's disk is full: the write was refused until the request's deadline. Retry once room is freed.", RetryAfter: outOfRoomRetryAfter}
	case holds.IsUnavailable(err), holds.IsBusy(err):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "billing_unavailable",
			Message: "The billing database is unreachable or too busy to answer now. Retry shortly.", RetryAfter: time.Second}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: "api_error", Code: "internal_error", Message: "Internal error; see the gateway log."}
}

// listUserPage answers a listing of one user's rows paged by a numeric id (keys, grants): the
// user, the page size and the cursor from the request (what names the id in a refusal), and
// one row more than asked for, whose coming is has_more.
func listUserPage[T any](h *handler, w http.ResponseWriter, r *http.Request, what string,
	fetch func(ctx context.Context, userID, afterID uint64, limit int) ([]T, error),
	view func(holds.UserDetail, T) map[string]any, id func(T) any) {
	d, ok := h.user(w, r)
	if !ok {
		return
	}
	limit, bad := limitParam(r)
	if bad != nil {
		writeError(w, bad)
		return
	}
	after, bad := idParam(r, what)
	if bad != nil {
		writeError(w, bad)
		return
	}
	rows, err := fetch(r.Context(), d.ID, after, limit+1)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, List(rows, limit, func(row T) map[string]any { return view(d, row) }, id))
}
