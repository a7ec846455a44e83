package admin_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

const adminToken = "admin-secret-token"

type fixture struct {
	t     *testing.T
	db    *sqlx.DB
	store *holds.Store
	url   string
}

func plans() map[string]holds.Plan {
	return map[string]holds.Plan{
		"standard": {AllowanceMicro: 2_000_000, HoldNormalMicro: 20_000, HoldHeavyMicro: 60_000, HeavyAfterTurns: 4,
			MaxInFlight: 3, MaxRunCostMicro: 500_000},
		"guest": {AllowanceMicro: 100_000, HoldNormalMicro: 20_000, HoldHeavyMicro: 60_000, HeavyAfterTurns: 4,
			MaxInFlight: 3, MaxRunCostMicro: 500_000, DiscountBP: 1_000},
	}
}

// newFixture serves the admin handler mounted at /admin the way the proxy mounts it, on a
// fresh database; the test ends with the ledger check.
func newFixture(t *testing.T, token string) *fixture {
	t.Helper()
	return newFixtureOn(t, token, testenv.MySQL(t))
}

// newFixtureMidday is newFixture with the database clock standing still at noon UTC
// (testenv.MySQLMidday), for a test whose charges must all land on one day's allowance.
func newFixtureMidday(t *testing.T, token string) *fixture {
	t.Helper()
	return newFixtureOn(t, token, testenv.MySQLMidday(t))
}

func newFixtureOn(t *testing.T, token string, db *sqlx.DB) *fixture {
	t.Helper()
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	st := holds.NewStore(db, plans(), "standard", log)
	r := chi.NewRouter()
	r.Mount("/admin", admin.New(st, 1000, token, log))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	return &fixture{t: t, db: db, store: st, url: srv.URL}
}

// admitInOneBatch admits reqs in one batch transaction (so they share created_at), each
// settled at cleanup.
func (f *fixture) admitInOneBatch(reqs []holds.AdmitRequest) {
	f.t.Helper()
	out, err := f.store.AdmitBatch(f.ctx(), reqs)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, o := range out {
		if o.Err != nil {
			f.t.Fatal(o.Err)
		}
	}
	f.t.Cleanup(func() {
		for _, r := range reqs {
			_, _ = f.store.Settle(f.ctx(), holds.Settlement{RunID: r.RunID, Source: holds.SourceComplete})
		}
	})
}

// settledRun admits a one-call run of model gpt-a for userID and settles it complete at
// costMicro (10 input and 5 output tokens).
func (f *fixture) settledRun(userID uint64, runID string, costMicro int64) {
	f.t.Helper()
	if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: runID, UserID: userID, Model: "gpt-a",
		State: holds.StateRunning, TTL: time.Minute}); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: runID, CostMicro: costMicro, Calls: 1,
		Usage: pricing.Usage{Input: 10, Output: 5}, Source: holds.SourceComplete}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	f.t.Cleanup(cancel)
	return ctx
}

// settledDay is the UTC day the test's latest settlement landed on (its database is its own),
// as YYYY-MM-DD: the "today" a test that settled calls then reports means. The report's own
// default, the database's day read after a midnight that fell between the two, is the next
// one, whose report is empty (TestReportDefaultDayIsTheDatabases checks that default).
func (f *fixture) settledDay() string {
	f.t.Helper()
	var day *string
	if err := f.db.GetContext(f.ctx(), &day, "SELECT DATE_FORMAT(MAX(settled_at), '%Y-%m-%d') FROM run_holds WHERE state = 'settled'"); err != nil || day == nil {
		f.t.Fatalf("the day of the latest settlement: %v, %v", day, err)
	}
	return *day
}

// csvReport fetches the usage report of the day of the latest settlement as CSV records,
// header first.
func (f *fixture) csvReport(t *testing.T) [][]string {
	t.Helper()
	day := f.settledDay()
	status, _, raw := f.call("GET", "/admin/reports/usage?format=csv&from="+day+"&to="+day, adminToken, nil)
	if status != http.StatusOK {
		t.Fatalf("csv: %d %s", status, raw)
	}
	recs, err := csv.NewReader(bytes.NewReader(raw)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// call sends a request with bearer token tok and decodes a JSON answer (nil for CSV).
func (f *fixture) call(method, path, tok string, body any, hdr ...string) (int, map[string]any, []byte) {
	f.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			f.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(f.ctx(), method, f.url+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	var out map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && method != http.MethodHead {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&out); err != nil {
			f.t.Fatalf("%s %s: bad JSON %q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode, out, raw
}

// admin is call with the admin token, expecting status.
func (f *fixture) admin(method, path string, body any, want int, hdr ...string) map[string]any {
	f.t.Helper()
	status, out, raw := f.call(method, path, adminToken, body, hdr...)
	if status != want {
		f.t.Fatalf("%s %s: %d %s, want %d", method, path, status, raw, want)
	}
	return out
}

func errCode(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	if e == nil || e["message"] == nil || e["type"] == nil {
		return "<not an OpenAI error shape>"
	}
	c, _ := e["code"].(string)
	return c
}

// snapshot is every row of every table that holds state, for "nothing changed" checks.
func (f *fixture) snapshot() string {
	f.t.Helper()
	var b strings.Builder
	for _, table := range []string{"users", "api_keys", "grants", "run_holds", "usage_days"} {
		rows, err := f.db.QueryxContext(f.ctx(), "SELECT * FROM "+table+" ORDER BY 1")
		if err != nil {
			f.t.Fatal(err)
		}
		for rows.Next() {
			m := map[string]any{}
			if err := rows.MapScan(m); err != nil {
				f.t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %v\n", table, m)
		}
		rows.Close()
	}
	return b.String()
}

// A user's API key on /admin is just a wrong token: 401 in the OpenAI error shape on every
// route, and not one row changes.
func TestUserKeyOnAdminIs401AndChangesNothing(t *testing.T) {
	f := newFixture(t, adminToken)
	u, err := f.store.CreateUser(f.ctx(), "mallory", "standard")
	if err != nil {
		t.Fatal(err)
	}
	key, err := f.store.CreateKey(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	before := f.snapshot()
	attempts := []struct {
		method, path string
		body         any
	}{
		{"POST", "/admin/users/mallory/grants", map[string]any{"amount": "1000", "idempotency_key": "self-help"}},
		{"POST", "/admin/users", map[string]any{"name": "eve"}},
		{"PATCH", "/admin/users/mallory", map[string]any{"plan": "guest", "discount_bp": 10000}},
		{"POST", "/admin/users/mallory/keys", nil},
		{"POST", "/admin/keys/revoke", map[string]any{"key": key}},
		{"POST", "/admin/users/mallory/disable", nil},
		{"GET", "/admin/users/mallory/balance", nil},
		{"GET", "/admin/runs", nil},
		{"GET", "/admin/reports/usage?format=csv", nil},
		{"GET", "/admin/nowhere", nil},
	}
	for _, a := range attempts {
		for _, tok := range []string{key, "", adminToken + "x", adminToken[:len(adminToken)-1]} {
			status, out, raw := f.call(a.method, a.path, tok, a.body)
			if status != http.StatusUnauthorized || errCode(out) != "invalid_admin_token" {
				t.Errorf("%s %s with token %q: %d %s", a.method, a.path, tok, status, raw)
			}
		}
		// x-api-key, the other header user keys travel in, is no way in either.
		status, _, _ := f.call(a.method, a.path, "", a.body, "x-api-key", key)
		if status != http.StatusUnauthorized {
			t.Errorf("%s %s with x-api-key: %d", a.method, a.path, status)
		}
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if _, err := f.store.UserByKey(f.ctx(), key); err != nil {
		t.Fatalf("the user's key should still work: %v", err)
	}
}

// No admin token configured: the admin API does not exist, whatever is sent.
// TestAdminPathNameIsDecodedOnce: a user name with a percent sign (the CLI allowed one
// before the store kept to the API's name rule; older databases may hold such names) is sent
// escaped, and names that user, not the one its double decoding would name.
func TestAdminPathNameIsDecodedOnce(t *testing.T) {
	f := newFixture(t, adminToken)
	for _, name := range []string{"a%41", "aA"} {
		if _, err := f.db.ExecContext(f.ctx(), "INSERT INTO users (name, plan) VALUES (?, 'standard')", name); err != nil {
			t.Fatal(err)
		}
	}
	if u := f.admin("GET", "/admin/users/a%2541", nil, http.StatusOK); u["name"] != "a%41" {
		t.Fatalf("GET /admin/users/a%%2541 answered user %v, want a%%41", u["name"])
	}
}

func TestAdminDisabledWithoutToken(t *testing.T) {
	f := newFixture(t, "")
	for _, tok := range []string{"", "anything"} {
		status, out, raw := f.call("POST", "/admin/users", tok, map[string]any{"name": "x"})
		if status != http.StatusNotFound || errCode(out) != "admin_disabled" {
			t.Fatalf("token %q: %d %s", tok, status, raw)
		}
	}
	var n int
	if err := f.db.GetContext(f.ctx(), &n, "SELECT COUNT(*) FROM users"); err != nil || n != 0 {
		t.Fatalf("%d users, %v", n, err)
	}
}

func TestAdminUsersKeysAndGrants(t *testing.T) {
	f := newFixture(t, adminToken)
	u := f.admin("POST", "/admin/users", map[string]any{"name": "acme"}, http.StatusCreated)
	if u["plan"] != "standard" || u["prepaid"] != json.Number("0") {
		t.Fatalf("created %v", u)
	}
	if out := f.admin("POST", "/admin/users", map[string]any{"name": "acme"}, http.StatusConflict); errCode(out) != "user_exists" {
		t.Fatalf("duplicate user: %v", out)
	}
	f.admin("POST", "/admin/users", map[string]any{"name": "a/b"}, http.StatusBadRequest)
	f.admin("POST", "/admin/users", map[string]any{"name": "x", "plan": "gold"}, http.StatusBadRequest)
	f.admin("POST", "/admin/users", map[string]any{"name": "x", "plna": "guest"}, http.StatusBadRequest)
	f.admin("GET", "/admin/users/nobody", nil, http.StatusNotFound)

	// A key is shown once; lists show its prefix only.
	k := f.admin("POST", "/admin/users/acme/keys", nil, http.StatusCreated)
	key, _ := k["key"].(string)
	if _, err := f.store.UserByKey(f.ctx(), key); err != nil {
		t.Fatalf("issued key: %v", err)
	}
	_, _, raw := f.call("GET", "/admin/users/acme/keys", adminToken, nil)
	if bytes.Contains(raw, []byte(key)) || !bytes.Contains(raw, []byte(key[:10])) {
		t.Fatalf("key list %s", raw)
	}

	// Grants: exact decimals, idempotent by key (body or header), refusals with their codes.
	g := f.admin("POST", "/admin/users/acme/grants", map[string]any{"amount": "12.5", "idempotency_key": "pay-1", "reason": "top-up"}, http.StatusCreated)
	if g["amount"] != json.Number("12.5") || g["prepaid_after"] != json.Number("12.5") || g["replayed"] != false {
		t.Fatalf("grant %v", g)
	}
	again := f.admin("POST", "/admin/users/acme/grants", map[string]any{"amount": 12.5, "reason": "top-up"}, http.StatusOK, "Idempotency-Key", "pay-1")
	if again["id"] != g["id"] || again["replayed"] != true {
		t.Fatalf("replay %v, first %v", again, g)
	}
	if out := f.admin("POST", "/admin/users/acme/grants", map[string]any{"amount": "13", "idempotency_key": "pay-1"}, http.StatusUnprocessableEntity); errCode(out) != "idempotency_key_reused" {
		t.Fatalf("reused key: %v", out)
	}
	if out := f.admin("POST", "/admin/users/acme/grants", map[string]any{"amount": "-12.501", "idempotency_key": "refund-1"}, http.StatusConflict); errCode(out) != "grant_below_zero" {
		t.Fatalf("refund past zero: %v", out)
	} else if msg := fmt.Sprint(out["error"].(map[string]any)["message"]); strings.Contains(msg, "micro") ||
		!strings.Contains(msg, "-12.501 credits") || !strings.Contains(msg, "12.5 credits") {
		// It said "prepaid 12500 micro-USD, grant -12501": the API takes and shows credits.
		t.Fatalf("refund past zero worded %q: want the amounts in credits", msg)
	}
	f.admin("POST", "/admin/users/acme/grants", map[string]any{"amount": "-2.5", "idempotency_key": "refund-1"}, http.StatusCreated)
	f.admin("POST", "/admin/users/acme/grants", map[string]any{"amount": "0.0001", "idempotency_key": "tiny"}, http.StatusBadRequest)
	f.admin("POST", "/admin/users/acme/grants", map[string]any{"amount": "1"}, http.StatusBadRequest) // no key
	f.admin("POST", "/admin/users/acme/grants", map[string]any{"ammount": "1", "idempotency_key": "typo"}, http.StatusBadRequest)
	list := f.admin("GET", "/admin/users/acme/grants", nil, http.StatusOK)
	if data, _ := list["data"].([]any); len(data) != 2 {
		t.Fatalf("grants %v", list)
	}

	b := f.admin("GET", "/admin/users/acme/balance", nil, http.StatusOK)
	if b["prepaid"] != json.Number("10") || b["available"] != json.Number("2010") || b["allowance"] != json.Number("2000") {
		t.Fatalf("balance %v", b)
	}

	// Plan and overrides, from the next admission.
	p := f.admin("PATCH", "/admin/users/acme", map[string]any{"plan": "guest", "allowance": "150.5", "discount_bp": 500}, http.StatusOK)
	eff, _ := p["effective"].(map[string]any)
	if p["plan"] != "guest" || eff["allowance"] != json.Number("150.5") || eff["discount_bp"] != json.Number("500") {
		t.Fatalf("patched %v", p)
	}
	f.admin("PATCH", "/admin/users/acme", map[string]any{"discount_bp": 10001}, http.StatusBadRequest)
	// A change is all or nothing: a bad figure beside a good plan changes neither.
	f.admin("PATCH", "/admin/users/acme", map[string]any{"plan": "standard", "max_in_flight": 0}, http.StatusBadRequest)
	if d := f.admin("GET", "/admin/users/acme", nil, http.StatusOK); d["plan"] != "guest" {
		t.Fatalf("plan changed by a refused PATCH: %v", d)
	}
	// null drops an override: the plan's figure applies again.
	p = f.admin("PATCH", "/admin/users/acme", map[string]any{"allowance": nil}, http.StatusOK)
	eff, _ = p["effective"].(map[string]any)
	over, _ := p["overrides"].(map[string]any)
	if eff["allowance"] != json.Number("100") || over["allowance"] != nil || eff["discount_bp"] != json.Number("500") {
		t.Fatalf("after clearing the allowance override: %v (the guest plan's 100 should apply, the discount stay)", p)
	}
	f.admin("PATCH", "/admin/users/acme", map[string]any{"allowance": "150.5"}, http.StatusOK)
	// An allowance finer than a micro-USD is refused saying how fine an amount may be.
	fine := f.admin("PATCH", "/admin/users/acme", map[string]any{"allowance": "0.0001"}, http.StatusBadRequest)
	if e, _ := fine["error"].(map[string]any); e == nil || !strings.Contains(fmt.Sprint(e["message"]), "steps of 0.001") {
		t.Errorf("allowance 0.0001: %v, want a message naming the step, 0.001 credits", fine)
	}
	uid := uint64(mustInt(t, p["id"]))
	h, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: "r_1", UserID: uid, State: holds.StateRunning, TTL: time.Minute, Model: "m"})
	if err != nil || h.DiscountBP != 500 {
		t.Fatalf("admission after patch: %+v, %v", h, err)
	}
	if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: "r_1", CostMicro: 10_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}

	// Disable refuses the key at once in the store; enable restores it.
	d := f.admin("POST", "/admin/users/acme/disable", nil, http.StatusOK)
	if d["disabled"] != true || d["changed"] != true {
		t.Fatalf("disable %v", d)
	}
	if _, err := f.store.UserByKey(f.ctx(), key); err == nil {
		t.Fatal("key of a disabled user still accepted")
	}
	if d := f.admin("POST", "/admin/users/acme/disable", nil, http.StatusOK); d["changed"] != false {
		t.Fatalf("disable twice %v", d)
	}
	f.admin("POST", "/admin/users/acme/enable", nil, http.StatusOK)
	if _, err := f.store.UserByKey(f.ctx(), key); err != nil {
		t.Fatalf("key after enable: %v", err)
	}

	// Revoke by value, then the same again is 404.
	// The user by name, as every admin view names users (it said its internal id).
	if out := f.admin("POST", "/admin/keys/revoke", map[string]any{"key": key}, http.StatusOK); out["user"] != "acme" || out["revoked"] != true {
		t.Fatalf("revoke: %v; want acme's key revoked", out)
	}
	if out := f.admin("POST", "/admin/keys/revoke", map[string]any{"key": key}, http.StatusNotFound); errCode(out) != "key_not_found" {
		t.Fatalf("revoke twice: %v", out)
	}
	if _, err := f.store.UserByKey(f.ctx(), key); err == nil {
		t.Fatal("revoked key still accepted")
	}
	k2 := f.admin("POST", "/admin/users/acme/keys", nil, http.StatusCreated)
	// Revoke by prefix answers as revoke by value does, with the number of keys it revoked.
	if out := f.admin("POST", "/admin/users/acme/keys/revoke", map[string]any{"prefix": k2["prefix"]}, http.StatusOK); out["revoked"] != true || mustInt(t, out["keys_revoked"]) != 1 {
		t.Fatalf("revoke by prefix: %v; want revoked true and keys_revoked 1", out)
	}

	users := f.admin("GET", "/admin/users?limit=10", nil, http.StatusOK)
	if data, _ := users["data"].([]any); len(data) != 1 {
		t.Fatalf("users %v", users)
	}
	f.admin("GET", "/admin/users?limit=0", nil, http.StatusBadRequest)
	f.admin("DELETE", "/admin/users/acme", nil, http.StatusMethodNotAllowed)
}

func mustInt(t *testing.T, v any) int64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v is not a number", v)
	}
	i, err := n.Int64()
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// A payment webhook delivered 20 times at once through the API credits once.
func TestGrantRetriedConcurrentlyOverHTTP(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "payer"}, http.StatusCreated)
	var wg sync.WaitGroup
	statuses := make([]int, 20)
	ids := make([]any, 20)
	for i := range statuses {
		wg.Go(func() {
			var out map[string]any
			statuses[i], out, _ = f.call("POST", "/admin/users/payer/grants", adminToken,
				map[string]any{"amount": "7.25", "reason": "stripe"}, "Idempotency-Key", "evt_42")
			ids[i] = out["id"]
		})
	}
	wg.Wait()
	created := 0
	for i, s := range statuses {
		switch s {
		case http.StatusCreated:
			created++
		case http.StatusOK:
		default:
			t.Fatalf("delivery %d: status %d", i, s)
		}
		if ids[i] != ids[0] {
			t.Fatalf("delivery %d answered grant %v, delivery 0 grant %v", i, ids[i], ids[0])
		}
	}
	if created != 1 {
		t.Fatalf("%d deliveries created a grant", created)
	}
	b := f.admin("GET", "/admin/users/payer/balance", nil, http.StatusOK)
	if b["prepaid"] != json.Number("7.25") {
		t.Fatalf("prepaid %v", b["prepaid"])
	}
}

// Runs listing and the usage report over HTTP; the report's totals, in JSON and in CSV, equal
// the day ledger and the sum of the settled holds.
func TestRunsAndUsageReport(t *testing.T) {
	// bob's 1-credit allowance splits his charges from prepaid on one day: the day stands still.
	f := newFixtureMidday(t, adminToken)
	var users []holds.User
	for _, name := range []string{"ann", "bob"} {
		f.admin("POST", "/admin/users", map[string]any{"name": name}, http.StatusCreated)
		u, err := f.store.UserByName(f.ctx(), name)
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, u)
	}
	f.admin("POST", "/admin/users/bob/grants", map[string]any{"amount": "100", "idempotency_key": "bob-1"}, http.StatusCreated)
	f.admin("PATCH", "/admin/users/bob", map[string]any{"allowance": "1"}, http.StatusOK)
	costs := []struct {
		user  int
		model string
		cost  int64
	}{{0, "gpt-a", 1_234}, {0, "=cmd()", 5_000}, {1, "gpt-a", 700}, {1, "gpt-b", 3_333}, {1, "gpt-b", 0}}
	for i, c := range costs {
		id := fmt.Sprintf("r_%d", i)
		if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: users[c.user].ID, Model: c.model,
			State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: c.cost, Calls: 1,
			Usage: pricing.Usage{Input: 10, Output: c.cost}, Source: holds.SourceComplete, Estimated: i == 2}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: "r_live", UserID: users[0].ID, Model: "gpt-a",
		State: holds.StateRunning, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}

	runs := f.admin("GET", "/admin/runs?user=bob&state=settled&limit=2", nil, http.StatusOK)
	data, _ := runs["data"].([]any)
	if len(data) != 2 {
		t.Fatalf("runs %v", runs)
	}
	for _, r := range data {
		if r.(map[string]any)["user"] != "bob" || r.(map[string]any)["state"] != "settled" {
			t.Fatalf("run %v", r)
		}
	}
	live := f.admin("GET", "/admin/runs?state=running", nil, http.StatusOK)
	if data, _ := live["data"].([]any); len(data) != 1 || data[0].(map[string]any)["id"] != "r_live" {
		t.Fatalf("live runs %v", live)
	}
	f.admin("GET", "/admin/runs?state=lost", nil, http.StatusBadRequest)
	f.admin("GET", "/admin/runs?since=yesterday", nil, http.StatusBadRequest)
	f.admin("GET", "/admin/runs?user=nobody", nil, http.StatusNotFound)
	// By settlement: the settled runs of today's report, whatever day they began, newest first.
	// Today is the day they settled on: UTC_DATE() may be past a midnight since.
	day := f.settledDay()
	today, err := time.Parse(time.DateOnly, day)
	if err != nil {
		t.Fatal(err)
	}
	tomorrow := today.AddDate(0, 0, 1).Format(time.DateOnly)
	settledToday := f.admin("GET", "/admin/runs?settled_since="+day+"&settled_until="+tomorrow, nil, http.StatusOK)
	if data, _ := settledToday["data"].([]any); len(data) != len(costs) {
		t.Fatalf("runs settled today %v, want the %d settled", settledToday, len(costs))
	}
	if none := f.admin("GET", "/admin/runs?settled_until="+day, nil, http.StatusOK); len(none["data"].([]any)) != 0 {
		t.Fatalf("runs settled before today %v, want none", none)
	}
	for _, q := range []string{"settled_since=yesterday", "settled_until=2026-13-01", "settled_since=" + day + "&state=running"} {
		if out := f.admin("GET", "/admin/runs?"+q, nil, http.StatusBadRequest); errCode(out) == "<not an OpenAI error shape>" {
			t.Errorf("%s: %v, want an error naming it", q, out)
		}
	}

	var ledger, settled int64
	if err := f.db.GetContext(f.ctx(), &ledger, "SELECT SUM(used_micro) FROM usage_days"); err != nil {
		t.Fatal(err)
	}
	if err := f.db.GetContext(f.ctx(), &settled, "SELECT SUM(charged_micro) FROM run_holds WHERE state = 'settled'"); err != nil {
		t.Fatal(err)
	}
	if ledger != settled || ledger != 1_234+5_000+700+3_333 {
		t.Fatalf("ledger %d, settled %d", ledger, settled)
	}
	want := pricing.FormatCredits(ledger, 1000)

	rep := f.admin("GET", "/admin/reports/usage?from="+day+"&to="+day, nil, http.StatusOK) // today, all users
	totals, _ := rep["totals"].(map[string]any)
	led, _ := rep["ledger"].(map[string]any)
	if totals["charged"] != json.Number(want) || led["charged"] != json.Number(want) || totals["runs"] != json.Number("5") {
		t.Fatalf("report totals %v, ledger %v, want charged %s", totals, led, want)
	}
	if rows, _ := rep["data"].([]any); len(rows) != 4 {
		t.Fatalf("report rows %v", rep["data"])
	}
	if tp, _ := totals["prepaid_part"].(json.Number); tp == "0" {
		t.Fatalf("bob's 1-credit allowance should have pushed charges into prepaid: %v", totals)
	}
	if totals["estimated_runs"] != json.Number("1") {
		t.Fatalf("report totals %v, want estimated_runs 1 (r_2 was charged an estimate)", totals)
	}

	recs := f.csvReport(t)
	if strings.Join(recs[0], ",") != strings.Join(admin.ReportCSVHeader, ",") || len(recs) != 5 {
		t.Fatalf("csv %q", recs)
	}
	var sum, estimatedRuns int64
	estimatedCol := slices.Index(admin.ReportCSVHeader, "estimated_runs")
	for _, rec := range recs[1:] {
		n, err := strconv.ParseInt(rec[estimatedCol], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		estimatedRuns += n
		m, err := pricing.ParseCredits(rec[11], 1000)
		if err != nil {
			t.Fatal(err)
		}
		sum += m
		if strings.HasPrefix(rec[2], "=") {
			t.Fatalf("formula cell %q", rec[2])
		}
	}
	if sum != ledger || estimatedRuns != 1 {
		t.Fatalf("csv charged sums to %d, ledger %d; estimated runs %d, want 1", sum, ledger, estimatedRuns)
	}

	one := f.admin("GET", "/admin/reports/usage?user=ann&from=2000-01-01&to=2000-01-31", nil, http.StatusOK)
	if rows, _ := one["data"].([]any); len(rows) != 0 {
		t.Fatalf("old range %v", one)
	}
	f.admin("GET", "/admin/reports/usage?from=2000-01-01&to=2003-01-01", nil, http.StatusBadRequest)
	f.admin("GET", "/admin/reports/usage?from=01/02/2000", nil, http.StatusBadRequest)
	f.admin("GET", "/admin/reports/usage?format=xml", nil, http.StatusBadRequest)

	if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: "r_live", CostMicro: 0, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestAdminBadInputsAre4xx: every malformed parameter is the caller's mistake: a 4xx in the
// error shape naming it, never a 500.
func TestAdminBadInputsAre4xx(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "probe"}, 201)
	for _, tc := range []struct {
		method, path string
		body         any
		hdr          []string
	}{
		{"GET", "/admin/reports/usage?from=9999-12-31&to=9999-12-31", nil, nil},
		{"GET", "/admin/runs?until=9999-12-31T23:00:00-05:00", nil, nil},
		{"GET", "/admin/runs?since=9999-12-31T23:00:00-05:00", nil, nil},
		{"GET", "/admin/runs?since=0000-01-01T00:00:00%2B01:00", nil, nil},
		{"POST", "/admin/users/probe/grants", map[string]any{"amount": "1"}, []string{"Idempotency-Key", "caf\xe9"}},
	} {
		status, out, raw := f.call(tc.method, tc.path, adminToken, tc.body, tc.hdr...)
		if status < 400 || status >= 500 || errCode(out) == "<not an OpenAI error shape>" {
			t.Errorf("%s %s: %d %s, want a 4xx naming the bad input", tc.method, tc.path, status, raw)
		} else {
			t.Logf("%s %s: %d %s", tc.method, tc.path, status, raw)
		}
	}
}
