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
	f.readOnly = func(on bool) {
		q := "SET GLOBAL read_only = 0"
		if on {
			q = "SET GLOBAL read_only = 1"
		}
		if _, err := root.Exec(q); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { f.readOnly(false) })
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

// TestAdminWriteRefusedReadOnlyIs503: a write the server refuses read_only (a failover's
// demoted primary, maintenance) is the database unable to take writes now — 503
// billing_unavailable with Retry-After, as for an unreachable one — not a 500 telling the
// operator's script its request is broken; and nothing of it is written.
func TestAdminWriteRefusedReadOnlyIs503(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newReadOnlyAdmin(ctx, t)
	f.readOnly(true)
	status, retry, code := f.post(ctx, t, "/admin/users", `{"name":"ro-new"}`)
	f.readOnly(false)
	if status != http.StatusServiceUnavailable || retry == "" || code != "billing_unavailable" {
		t.Errorf("create user on a read_only server: %d %s (Retry-After %q); want 503 billing_unavailable with Retry-After", status, code, retry)
	}
	var n int
	if err := f.root.GetContext(ctx, &n, "SELECT COUNT(*) FROM users WHERE name = 'ro-new'"); err != nil || n != 0 {
		t.Errorf("users named by the refused request: %d, %v; want none", n, err)
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
