package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// readOnlyAdmin serves the admin handler over a store on an account with what a production
// gateway's has (SELECT, INSERT, UPDATE, DELETE; neither SUPER nor READ_ONLY ADMIN), which
// read_only binds, with a handle of the tests' account (root) and what sets the server's
// read_only — set back off at cleanup before the ledger check and the database's drop.
type readOnlyAdmin struct {
	root     *sqlx.DB
	url      string
	logs     *observer.ObservedLogs
	readOnly func(on bool)
}

func newReadOnlyAdmin(ctx context.Context, t *testing.T) *readOnlyAdmin {
	t.Helper()
	dsn := testenv.MySQLDSN(t)
	root := testenv.Open(t, dsn)
	t.Cleanup(func() { testenv.CheckLedger(t, root) })
	f := &readOnlyAdmin{root: root}
	f.readOnly = testenv.ServerReadOnly(t, root) // set back off at cleanup
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := "tg_adm_" + testenv.RandomID(4)
	if _, err := root.ExecContext(ctx, "CREATE USER '"+name+"'@'%' IDENTIFIED BY 'gw'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = root.Exec("DROP USER IF EXISTS '" + name + "'@'%'") })
	if _, err := root.ExecContext(ctx, "GRANT SELECT, INSERT, UPDATE, DELETE ON `"+cfg.DBName+"`.* TO '"+name+"'@'%'"); err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = name, "gw"
	core, logs := observer.New(zapcore.WarnLevel)
	f.logs = logs
	st := holds.NewStore(testenv.Open(t, cfg.FormatDSN()), plans(), "standard", zap.New(core))
	r := chi.NewRouter()
	r.Mount("/admin", admin.New(st, 1000, adminToken, zap.New(core)))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// post sends an admin POST and returns its status, its Retry-After and its error code.
func (f *readOnlyAdmin) post(ctx context.Context, t *testing.T, path, body string) (int, string, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0, "", ""
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, "", ""
	}
	defer resp.Body.Close()
	var out struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, resp.Header.Get("Retry-After"), out.Error.Code
}

// send sends an admin request with a JSON body (may be "") and returns its status, its
// Retry-After, its error code and its body.
func (f *readOnlyAdmin) send(ctx context.Context, t *testing.T, method, path, body string) (int, string, string, map[string]any) {
	req, err := http.NewRequestWithContext(ctx, method, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0, "", "", nil
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, "", "", nil
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	code := ""
	if e, ok := out["error"].(map[string]any); ok {
		code, _ = e["code"].(string)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), code, out
}

// count is a COUNT(*) of the test's database, by the tests' account.
func (f *readOnlyAdmin) count(ctx context.Context, t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := f.root.GetContext(ctx, &n, q, args...); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAdminWriteReadOnlyRiddenOutThen503: the admin API's creation of a user and of a key,
// and a key's revocation, refused by a server turned read_only (a failover's demoted primary,
// maintenance), are tried again within the request's deadline, as a grant is: a switch of
// seconds delays them and refuses nothing. Refused at once, each answered 503 during the
// spell, and the operator's script had to retry by hand. Each lands once — one user, one new
// key, the one key revoked — since only the server's read_only refusal, which ran nothing, is
// sent again (an INSERT whose reply was lost is not: a user's second try would answer 409 for
// the user it made, a key's would leave a live key nobody was shown). A spell that outlasts
// the request's deadline is answered 503 billing_unavailable with Retry-After — the database
// unable to take writes now, not a 500 telling the script its request is broken — with
// nothing written.
func TestAdminWriteReadOnlyRiddenOutThen503(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newReadOnlyAdmin(ctx, t)
	if status, _, code, _ := f.send(ctx, t, http.MethodPost, "/admin/users", `{"name":"ro-keys"}`); status != http.StatusCreated {
		t.Fatalf("create user: %d %s", status, code)
	}
	status, _, code, body := f.send(ctx, t, http.MethodPost, "/admin/users/ro-keys/keys", "")
	old, _ := body["key"].(string)
	if status != http.StatusCreated || old == "" {
		t.Fatalf("create key: %d %s %v", status, code, body)
	}
	userKeys := func() int {
		return f.count(ctx, t, "SELECT COUNT(*) FROM api_keys k JOIN users u ON u.id = k.user_id WHERE u.name = 'ro-keys'")
	}
	live := func(key string) int {
		h := holds.HashKey(key)
		return f.count(ctx, t, "SELECT COUNT(*) FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL", h[:])
	}

	// A short spell: it ends once each write has been seen refused and waiting.
	type answer struct {
		status int
		code   string
		body   map[string]any
	}
	writes := []struct{ op, method, path, body string }{
		{"create user", http.MethodPost, "/admin/users", `{"name":"ro-new"}`},
		{"create key", http.MethodPost, "/admin/users/ro-keys/keys", ""},
		{"revoke key", http.MethodPost, "/admin/keys/revoke", `{"key":"` + old + `"}`},
	}
	f.readOnly(true)
	answers := make([]chan answer, len(writes))
	for i, w := range writes {
		answers[i] = make(chan answer, 1)
		go func() {
			status, _, code, body := f.send(ctx, t, w.method, w.path, w.body)
			answers[i] <- answer{status, code, body}
		}()
	}
	refused := func(op string) int {
		return f.logs.FilterMessage("database unavailable, retrying").FilterField(zap.String("op", op)).Len()
	}
	for i := 0; i < len(writes); {
		if refused(writes[i].op) >= 2 {
			i++
			continue
		}
		select {
		case a := <-answers[i]:
			f.readOnly(false)
			t.Fatalf("%s during a read_only spell: %d %s; want it tried again until the server takes writes", writes[i].op, a.status, a.code)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	f.readOnly(false)
	got := make([]answer, len(writes))
	for i := range writes {
		got[i] = <-answers[i]
	}
	if got[0].status != http.StatusCreated || got[1].status != http.StatusCreated || got[2].status != http.StatusOK {
		t.Fatalf("once the server took writes: create user %d %s, create key %d %s, revoke %d %s; want 201, 201, 200",
			got[0].status, got[0].code, got[1].status, got[1].code, got[2].status, got[2].code)
	}
	if n := f.count(ctx, t, "SELECT COUNT(*) FROM users WHERE name = 'ro-new'"); n != 1 {
		t.Errorf("users named ro-new after the spell: %d; want 1", n)
	}
	created, _ := got[1].body["key"].(string)
	if n := userKeys(); n != 2 || live(created) != 1 || live(old) != 0 {
		t.Errorf("after the spell: %d keys of ro-keys, the new one live %d, the revoked one live %d; want 2, 1, 0",
			n, live(created), live(old))
	}

	// A spell longer than the request's deadline: 503 with Retry-After, nothing written.
	defer admin.SetRequestTimeout(300 * time.Millisecond)()
	f.readOnly(true)
	late := []struct{ what, method, path, body string }{
		{"create user", http.MethodPost, "/admin/users", `{"name":"ro-late"}`},
		{"create key", http.MethodPost, "/admin/users/ro-keys/keys", ""},
		{"revoke key", http.MethodPost, "/admin/keys/revoke", `{"key":"` + created + `"}`},
		{"grant", http.MethodPost, "/admin/users/ro-keys/grants", `{"amount":"5","idempotency_key":"ro-late-pay"}`},
	}
	for _, w := range late {
		status, retry, code, _ := f.send(ctx, t, w.method, w.path, w.body)
		if status != http.StatusServiceUnavailable || retry == "" || code != "billing_unavailable" {
			t.Errorf("%s past the request's deadline on a read_only server: %d %s (Retry-After %q); want 503 billing_unavailable with Retry-After",
				w.what, status, code, retry)
		}
	}
	f.readOnly(false)
	if n := f.count(ctx, t, "SELECT COUNT(*) FROM users WHERE name = 'ro-late'"); n != 0 {
		t.Errorf("users named by the refused request: %d; want none", n)
	}
	if n := userKeys(); n != 2 || live(created) != 1 {
		t.Errorf("after the refused requests: %d keys of ro-keys, the last one live %d; want 2, 1", n, live(created))
	}
	if n := f.count(ctx, t, "SELECT COUNT(*) FROM grants WHERE idempotency_key = 'ro-late-pay'"); n != 0 {
		t.Errorf("grant rows of the refused grant: %d; want none", n)
	}
}

// TestAdminGrantRidesOutAReadOnlySpell: a grant (one transaction of its own, as a session's
// claim or a key's revocation is) refused read_only is tried again within the request's
// deadline, as an admission or a settlement is: a failover's switch of seconds delays it and
// refuses nothing. Refused at once, it answered 500. It lands once: one grant row, the
// balance raised by its amount.
func TestAdminGrantRidesOutAReadOnlySpell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newReadOnlyAdmin(ctx, t)
	if status, _, code := f.post(ctx, t, "/admin/users", `{"name":"ro-grant"}`); status != http.StatusCreated {
		t.Fatalf("create user: %d %s", status, code)
	}
	var before int64
	if err := f.root.GetContext(ctx, &before, "SELECT prepaid_micro FROM users WHERE name = 'ro-grant'"); err != nil {
		t.Fatal(err)
	}
	f.readOnly(true)
	type answer struct {
		status int
		code   string
	}
	done := make(chan answer, 1)
	go func() {
		status, _, code := f.post(ctx, t, "/admin/users/ro-grant/grants", `{"amount":"5","idempotency_key":"ro-pay-1"}`)
		done <- answer{status, code}
	}()
	retries := func() int { return f.logs.FilterMessage("database unavailable, retrying").Len() }
	for retries() < 3 {
		select {
		case a := <-done:
			f.readOnly(false)
			t.Fatalf("grant during a read_only spell: %d %s; want it tried again until the server takes writes", a.status, a.code)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	f.readOnly(false)
	if a := <-done; a.status != http.StatusCreated {
		t.Fatalf("grant once the server took writes: %d %s; want 201", a.status, a.code)
	}
	var grants int
	var after int64
	if err := f.root.GetContext(ctx, &grants, "SELECT COUNT(*) FROM grants WHERE idempotency_key = 'ro-pay-1'"); err != nil {
		t.Fatal(err)
	}
	if err := f.root.GetContext(ctx, &after, "SELECT prepaid_micro FROM users WHERE name = 'ro-grant'"); err != nil {
		t.Fatal(err)
	}
	if grants != 1 || after-before != 5_000 {
		t.Errorf("after the spell: %d grant rows, balance raised by %d; want 1 and 5000 (5 credits of 1000 micro-USD)", grants, after-before)
	}
}
