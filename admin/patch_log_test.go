package admin_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestEmptyUserPatchLogsNoChange: the admin log's "admin: user changed" lines are the trail of
// who changed which user's terms. A PATCH of {} names no field and changes nothing, but was
// logged as a change all the same. It answers the user as it is, and logs nothing; a PATCH
// that names a field is logged.
func TestEmptyUserPatchLogsNoChange(t *testing.T) {
	db := testenv.MySQL(t)
	core, logs := observer.New(zapcore.InfoLevel)
	st := holds.NewStore(db, plans(), "standard", zap.New(core))
	r := chi.NewRouter()
	r.Mount("/admin", admin.New(st, 1000, adminToken, zap.New(core)))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	send := func(method, path, body string, want int) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s %s %s: %d, want %d", method, path, body, resp.StatusCode, want)
		}
	}
	send("POST", "/admin/users", `{"name":"ann"}`, http.StatusCreated)
	send("PATCH", "/admin/users/ann", `{}`, http.StatusOK)
	if n := logs.FilterMessage("admin: user changed").Len(); n != 0 {
		t.Errorf("PATCH {} logged %d changes, want none: nothing changed", n)
	}
	send("PATCH", "/admin/users/ann", `{"plan":"guest"}`, http.StatusOK)
	if n := logs.FilterMessage("admin: user changed").Len(); n != 1 {
		t.Errorf("PATCH of the plan logged %d changes, want 1", n)
	}
}
