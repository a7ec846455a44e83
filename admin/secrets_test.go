package admin_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// An operator who pastes a whole key where revoke-by-prefix wants its prefix is refused, and
// neither the answer nor the log line of the refusal may quote the key: it is still live (the
// request revoked nothing), and the log is read by more people than hold keys.
func TestRevokeByPrefixDoesNotQuoteAWholeKey(t *testing.T) {
	db, st, srv, logs := observedAdmin(t)
	t.Cleanup(func() { testenv.CheckLedger(t, db) })

	ctx := t.Context()
	u, err := st.CreateUser(ctx, "acme", "standard")
	if err != nil {
		t.Fatal(err)
	}
	key, err := st.CreateKey(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	secret := key[holds.KeyPrefixLen:] // the part no listing shows

	body, _ := json.Marshal(map[string]string{"prefix": key})
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/admin/users/acme/keys/revoke", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d (%s), want 400", resp.StatusCode, answer)
	}
	if strings.Contains(string(answer), secret) {
		t.Errorf("the answer quotes the whole key: %s", answer)
	}
	for _, e := range logs.All() {
		line, _ := json.Marshal(e.ContextMap())
		if strings.Contains(e.Message, secret) || strings.Contains(string(line), secret) {
			t.Errorf("log line %q quotes the whole key: %s", e.Message, line)
		}
	}
	if _, err := st.UserByKey(ctx, key); err != nil {
		t.Errorf("the refused request revoked the key: %v", err)
	}
}

// TestBadTokenLogLineDoesNotQuoteAHugeRequest: a request refused for its token writes its
// path, and anyone who reaches the listener can send one as long as the server's header bound
// (64 KiB): a stranger made the gateway write a 64 KiB line per request. It is quoted up to 512
// bytes, as the gateway quotes whatever a caller sent.
func TestBadTokenLogLineDoesNotQuoteAHugeRequest(t *testing.T) {
	_, _, srv, logs := observedAdmin(t)

	long := strings.Repeat("x", 60_000)
	for _, c := range []struct{ method, path, token string }{
		{http.MethodGet, "/admin/users/" + long, "wrong"},
		{http.MethodPost, "/admin/users/" + long + "/disable", "wrong"},
		{http.MethodGet, "/admin/users/" + long + "/balance", adminToken}, // refused 404 with the token
	} {
		logs.TakeAll()
		req, _ := http.NewRequestWithContext(t.Context(), c.method, srv.URL+c.path, nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("%.10s %.20s…: %d, want a refusal", c.method, c.path, resp.StatusCode)
		}
		lines := logs.TakeAll()
		if len(lines) == 0 {
			t.Fatalf("%.10s %.20s…: %d, no line", c.method, c.path, resp.StatusCode)
		}
		for _, l := range lines {
			for k, v := range l.ContextMap() {
				if s, ok := v.(string); ok && len(s) > 512 {
					t.Errorf("%.10s %.20s…: %q field %s quotes %d bytes, want at most 512", c.method, c.path, l.Message, k, len(s))
				}
			}
		}
	}
}

// observedAdmin serves the admin API on a test server whose log lines are observed.
func observedAdmin(t *testing.T) (*sqlx.DB, *holds.Store, *httptest.Server, *observer.ObservedLogs) {
	t.Helper()
	db := testenv.MySQL(t)
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	st := holds.NewStore(db, plans(), "standard", log)
	r := chi.NewRouter()
	r.Mount("/admin", admin.New(st, 1000, adminToken, log))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return db, st, srv, logs
}
