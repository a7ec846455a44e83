package admin_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/admin"
)

// TestAdminFailureLinesNameTheirAnswer: a store error's line, "admin request failed" (5xx) or
// "admin request refused" (4xx), carries the status and code its caller was answered, as a
// refused model call's line does: "admin request failed" had neither, so a 500 internal_error
// could not be told from a 503 billing_unavailable (a database out, which the script behind it
// retries) but by the wording of the error beside it.
func TestAdminFailureLinesNameTheirAnswer(t *testing.T) {
	f := newFixture(t, adminToken)
	core, logs := observer.New(zapcore.InfoLevel)
	r := chi.NewRouter()
	r.Mount("/admin", admin.New(f.store, 1000, adminToken, zap.New(core)))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	f.admin("POST", "/admin/users", map[string]any{"name": "logged"}, http.StatusCreated)
	f.admin("POST", "/admin/users", map[string]any{"name": "logged"}, http.StatusConflict)
	if _, err := f.db.ExecContext(f.ctx(), "RENAME TABLE api_keys TO api_keys_away"); err != nil {
		t.Fatal(err)
	}
	f.admin("GET", "/admin/users/logged/keys", nil, http.StatusInternalServerError)
	if _, err := f.db.ExecContext(f.ctx(), "RENAME TABLE api_keys_away TO api_keys"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		msg    string
		status int64
		code   string
	}{
		{"admin request refused", http.StatusConflict, "user_exists"},
		{"admin request failed", http.StatusInternalServerError, "internal_error"},
	} {
		lines := logs.FilterMessage(c.msg).All()
		if len(lines) != 1 {
			t.Fatalf("%d %q lines, want 1: %v", len(lines), c.msg, logs.All())
		}
		if f := lines[0].ContextMap(); f["status"] != c.status || f["code"] != c.code {
			t.Errorf("%q: status %v code %v, want %d %s: %v", c.msg, f["status"], f["code"], c.status, c.code, f)
		}
	}
}
