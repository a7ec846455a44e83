package admin_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
)

// adminRoutes is every admin route with the methods it serves, written out here rather than
// read from the router, so the test says what the API is meant to answer.
var adminRoutes = map[string][]string{
	"/users":                    {"GET", "POST"},
	"/users/{name}":             {"GET", "PATCH"},
	"/users/{name}/disable":     {"POST"},
	"/users/{name}/enable":      {"POST"},
	"/users/{name}/keys":        {"GET", "POST"},
	"/users/{name}/keys/revoke": {"POST"},
	"/users/{name}/grants":      {"GET", "POST"},
	"/users/{name}/balance":     {"GET"},
	"/keys/revoke":              {"POST"},
	"/runs":                     {"GET"},
	"/reports/usage":            {"GET"},
	"/instances":                {"GET"},
}

// TestWrongMethodIs405WithAllow: a wrong method on an admin route got 405 without the Allow
// header RFC 9110 requires, so a client could not learn the methods the route serves. Every
// route, answered with each method it does not serve, now gets 405 method_not_allowed in the
// error shape and an Allow listing exactly its methods — /users/{name} included, where a
// sub-router once made every method look allowed. No request reaches the store (it has no
// database: a 405 needs none).
func TestWrongMethodIs405WithAllow(t *testing.T) {
	st := holds.NewStore(nil, plans(), "standard", zap.NewNop())
	r := chi.NewRouter()
	h := admin.New(st, 1000, adminToken, zap.NewNop())
	r.Mount("/admin", h)

	// The table covers every route the router serves, and with the same methods.
	served := map[string][]string{}
	if err := chi.Walk(h.(chi.Routes), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		served[route] = append(served[route], method)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for route, methods := range served {
		slices.Sort(methods)
		if want := adminRoutes[route]; !slices.Equal(methods, want) {
			t.Errorf("the router serves %s %v; the test's table says %v", route, methods, want)
		}
	}
	for route := range adminRoutes {
		if served[route] == nil {
			t.Errorf("the test's table lists %s, which the router does not serve", route)
		}
	}

	for route, allowed := range adminRoutes {
		// A name with an escaped slash is routed on the raw path, as chi routes it.
		for _, name := range []string{"some.user", "a%2Fb"} {
			path := "/admin" + strings.ReplaceAll(route, "{name}", name)
			wrongMethods(t, r, path, allowed)
		}
	}
}

// wrongMethods sends every method path does not serve and checks the 405 answer. A route
// that serves GET serves HEAD too, and its Allow says so.
func wrongMethods(t *testing.T, r http.Handler, path string, allowed []string) {
	t.Helper()
	if slices.Contains(allowed, "GET") {
		allowed = slices.Insert(slices.Clone(allowed), 1, "HEAD")
	}
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		if slices.Contains(allowed, m) {
			continue
		}
		req := httptest.NewRequest(m, path, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: %d %s, want 405", m, path, w.Code, w.Body)
			continue
		}
		if got, want := w.Header().Get("Allow"), strings.Join(allowed, ", "); got != want {
			t.Errorf("%s %s: Allow %q, want %q", m, path, got, want)
		}
		if m != "HEAD" && !strings.Contains(w.Body.String(), `"code":"method_not_allowed"`) {
			t.Errorf("%s %s: body %s, want the error shape with code method_not_allowed", m, path, w.Body)
		}
	}
}

// TestHeadIsAnsweredLikeGet: HEAD on an admin GET route was 405 (a monitor probing the admin
// API with HEAD saw it down); it now gets the GET answer's status without its body, and the
// same refusals a GET gets.
func TestHeadIsAnsweredLikeGet(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "acme"}, http.StatusCreated)
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/admin/users", http.StatusOK},
		{"/admin/users/acme", http.StatusOK},
		{"/admin/users/acme/balance", http.StatusOK},
		{"/admin/users/nobody", http.StatusNotFound},
	} {
		status, _, raw := f.call("HEAD", tc.path, adminToken, nil)
		if status != tc.want || len(raw) != 0 {
			t.Errorf("HEAD %s: %d body %q, want %d without a body", tc.path, status, raw, tc.want)
		}
	}
	if status, _, _ := f.call("HEAD", "/admin/users", "wrong", nil); status != http.StatusUnauthorized {
		t.Errorf("HEAD /admin/users with a wrong token: %d, want 401", status)
	}
}
