package admin_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
)

// The tests here each catch mutants a mutation review of the admin API found surviving; each
// names them.

// TestAdminTokenSchemeAndSpacing: the scheme is matched case-insensitively and the token
// trimmed, as config's admin_token check promises (it refuses a token with white space at
// either end because the API trims what a caller sends). Mutants: EqualFold -> ==; TrimSpace
// dropped. Every answer is no-store: one carries a new key in clear (mutant: Cache-Control
// changed).
func TestAdminTokenSchemeAndSpacing(t *testing.T) {
	f := newFixture(t, adminToken)
	for i, auth := range []string{"bearer " + adminToken, "BEARER " + adminToken, "Bearer  " + adminToken + "\t"} {
		req, err := http.NewRequestWithContext(f.ctx(), http.MethodPost, f.url+"/admin/users", strings.NewReader(`{"name":"u`+fmt.Sprint(i)+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("Authorization %q: %d, want 201", auth, resp.StatusCode)
		}
		if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("Authorization %q: Cache-Control %q, want no-store", auth, cc)
		}
	}
}

// TestNewRefusesANonPositiveCreditMicro: credits of 0 micro-USD would divide by zero in every
// view. Mutant: creditMicro <= 0 -> < 0.
func TestNewRefusesANonPositiveCreditMicro(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("admin.New with credit_micro 0 did not panic")
		}
	}()
	admin.New(nil, 0, adminToken, zap.NewNop())
}

// TestOverrideEdges: PATCH's overrides are refused one step past each edge and accepted at it;
// a negative allowance is refused. Mutants: `m >= 0` dropped from the allowance check;
// intWithin's >= lo -> > lo and <= hi -> < hi.
func TestOverrideEdges(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "edgy"}, http.StatusCreated)
	for _, body := range []map[string]any{{"allowance": "-1"}, {"allowance": "-0.001"}, {"max_in_flight": 10_001},
		{"discount_bp": -1}} {
		if out := f.admin("PATCH", "/admin/users/edgy", body, http.StatusBadRequest); errCode(out) == "<not an OpenAI error shape>" {
			t.Errorf("PATCH %v: %v", body, out)
		}
	}
	for _, body := range []map[string]any{{"max_in_flight": 1, "discount_bp": 0, "allowance": "0"},
		{"max_in_flight": 10_000, "discount_bp": 10_000}} {
		p := f.admin("PATCH", "/admin/users/edgy", body, http.StatusOK)
		over, _ := p["overrides"].(map[string]any)
		for k, v := range body {
			if fmt.Sprint(over[k]) != fmt.Sprint(v) {
				t.Errorf("PATCH %v: override %s = %v, want %v", body, k, over[k], v)
			}
		}
	}
}

// TestGrantAndBalanceFigures: a grant shows its own amount beside the prepaid balance after
// it, a refund refused for going below zero says so (not that calls in flight hold too much),
// one refused for a hold says that, and the balance shows what live calls hold. Mutants:
// amount shows BalanceAfterMicro; `HeldMicro > 0` -> `>= 0`; balance's held shows used_today;
// the missing-key check of /keys/revoke dropped.
func TestGrantAndBalanceFigures(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "payer"}, http.StatusCreated)
	f.admin("POST", "/admin/users/payer/grants", map[string]any{"amount": "100", "idempotency_key": "g1"}, http.StatusCreated)
	g := f.admin("POST", "/admin/users/payer/grants", map[string]any{"amount": "1.5", "idempotency_key": "g2"}, http.StatusCreated)
	if g["amount"] != json.Number("1.5") || g["prepaid_after"] != json.Number("101.5") {
		t.Fatalf("second grant %v, want amount 1.5 and prepaid_after 101.5", g)
	}
	below := f.admin("POST", "/admin/users/payer/grants", map[string]any{"amount": "-102", "idempotency_key": "r1"}, http.StatusConflict)
	if msg := fmt.Sprint(below["error"]); !strings.Contains(msg, "below zero: the user has 101.5 credits prepaid") || strings.Contains(msg, "would leave less than") {
		t.Fatalf("refund past zero with nothing held: %v", below)
	}

	u, err := f.store.UserByName(f.ctx(), "payer")
	if err != nil {
		t.Fatal(err)
	}
	// Spend the allowance so that the hold comes out of prepaid credits.
	f.admin("PATCH", "/admin/users/payer", map[string]any{"allowance": "0"}, http.StatusOK)
	f.admitInOneBatch([]holds.AdmitRequest{{RunID: "r_held", UserID: u.ID, Model: "m", State: holds.StateRunning, TTL: time.Minute}})
	b := f.admin("GET", "/admin/users/payer/balance", nil, http.StatusOK)
	if b["held"] != json.Number("20") || b["used_today"] != json.Number("0") || b["prepaid"] != json.Number("101.5") ||
		b["available"] != json.Number("81.5") || b["in_flight"] != json.Number("1") {
		t.Fatalf("balance with one call holding 20 credits: %v", b)
	}
	held := f.admin("POST", "/admin/users/payer/grants", map[string]any{"amount": "-90", "idempotency_key": "r2"}, http.StatusConflict)
	if msg := fmt.Sprint(held["error"]); !strings.Contains(msg, "would leave less than the user's calls in flight hold") || !strings.Contains(msg, "(20 credits of the 101.5 credits prepaid)") {
		t.Fatalf("refund refused for a hold: %v", held)
	}

	if out := f.admin("POST", "/admin/keys/revoke", map[string]any{}, http.StatusBadRequest); errCode(out) != "missing_key" {
		t.Fatalf("revoke with no key: %v", out)
	}
}

// TestUserFilterOfRunsAndReport: ?user= keeps another user's runs out of the listing and the
// report. Mutants: f.UserID = d.ID and userID = d.ID dropped. An unknown format is refused
// (mutant: the format check only refusing "xml").
func TestUserFilterOfRunsAndReport(t *testing.T) {
	f := newFixture(t, adminToken)
	ids := map[string]uint64{}
	for _, name := range []string{"ann", "bob"} {
		f.admin("POST", "/admin/users", map[string]any{"name": name}, http.StatusCreated)
		u, err := f.store.UserByName(f.ctx(), name)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = u.ID
	}
	for i, name := range []string{"ann", "bob", "bob"} {
		id := fmt.Sprintf("r_%s_%d", name, i)
		if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: ids[name], Model: "gpt-a", State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: 1_000, Calls: 1, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	runs := f.admin("GET", "/admin/runs?user=ann", nil, http.StatusOK)
	if data, _ := runs["data"].([]any); len(data) != 1 || data[0].(map[string]any)["user"] != "ann" {
		t.Fatalf("ann's runs: %v", runs)
	}
	day := f.settledDay() // not the default day: midnight may have passed since the settlements
	rep := f.admin("GET", "/admin/reports/usage?user=ann&from="+day+"&to="+day, nil, http.StatusOK)
	rows, _ := rep["data"].([]any)
	totals, _ := rep["totals"].(map[string]any)
	if len(rows) != 1 || rows[0].(map[string]any)["user"] != "ann" || totals["charged"] != json.Number("1") {
		t.Fatalf("ann's report: %v", rep)
	}
	f.admin("GET", "/admin/reports/usage?format=pdf", nil, http.StatusBadRequest)
}

// TestReportCSVQuotesAFormulaStartingWithMinus: a text cell starting with '-' (a model name
// such as "-2+3") is read as a formula by a spreadsheet. Mutant: the '-' case dropped.
func TestReportCSVQuotesAFormulaStartingWithMinus(t *testing.T) {
	var b strings.Builder
	rep := holds.UsageReport{Rows: []holds.UsageRow{{UserName: "ann", Day: "2026-01-01", Model: "-2+3"}}}
	if err := (admin.Views{CreditMicro: 1000}).WriteReportCSV(&b, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), ",'-2+3,") {
		t.Fatalf("CSV %q: want the model cell quoted as '-2+3", b.String())
	}
}

// TestGrantAmountOfOneDigit: an amount sent as a JSON number of one character (5) is the
// number it says, as "5" or 12.5 are. Mutant: parseAmount reading raw only past one byte.
func TestGrantAmountOfOneDigit(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "digit"}, http.StatusCreated)
	g := f.admin("POST", "/admin/users/digit/grants", map[string]any{"amount": 5, "idempotency_key": "d1"}, http.StatusCreated)
	if g["amount"] != json.Number("5") || g["prepaid_after"] != json.Number("5") {
		t.Fatalf("grant of 5: %v, want amount 5 and prepaid_after 5", g)
	}
}

// TestPatchToAPlanNotConfiguredIsRefused: PATCH's plan must name a configured plan, and the
// refusal names those there are; an empty plan is none of them and must not pass as "no
// change" (the store reads "" so). Mutant: the HasPlan check before ChangeUser dropped.
func TestPatchToAPlanNotConfiguredIsRefused(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "planned", "plan": "guest"}, http.StatusCreated)
	for _, plan := range []string{"", "gold"} {
		out := f.admin("PATCH", "/admin/users/planned", map[string]any{"plan": plan}, http.StatusBadRequest)
		if errCode(out) != "unknown_plan" || !strings.Contains(fmt.Sprint(out["error"]), "configured: guest, standard") {
			t.Errorf("PATCH plan %q: %v, want unknown_plan naming the configured plans", plan, out)
		}
	}
	if u := f.admin("GET", "/admin/users/planned", nil, http.StatusOK); u["plan"] != "guest" {
		t.Fatalf("user after refused plan changes: %v, want plan guest", u)
	}
}

// TestListLimitEdges: a page size is 1 to MaxListLimit. Mutant: the upper bound moved one
// past MaxListLimit.
func TestListLimitEdges(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("GET", fmt.Sprintf("/admin/users?limit=%d", admin.MaxListLimit), nil, http.StatusOK)
	f.admin("GET", "/admin/users?limit=1", nil, http.StatusOK)
	for _, limit := range []int{0, admin.MaxListLimit + 1} {
		if out := f.admin("GET", fmt.Sprintf("/admin/users?limit=%d", limit), nil, http.StatusBadRequest); errCode(out) != "invalid_limit" {
			t.Errorf("limit=%d: %v, want invalid_limit", limit, out)
		}
	}
}

// TestUserViewShowsEachEffectiveTerm: a user's effective terms are the plan's, each under its
// own name (standard: holds of 20 and 60 credits, a cap of 500, 3 calls in flight, turn 4 on
// heavy, 2000 a day). Mutant: hold_normal and hold_heavy swapped.
func TestUserViewShowsEachEffectiveTerm(t *testing.T) {
	f := newFixture(t, adminToken)
	u := f.admin("POST", "/admin/users", map[string]any{"name": "termed"}, http.StatusCreated)
	eff, _ := u["effective"].(map[string]any)
	want := map[string]json.Number{"hold_normal": "20", "hold_heavy": "60", "max_run_cost": "500", "max_in_flight": "3",
		"heavy_after_turns": "4", "allowance": "2000", "discount_bp": "0"}
	for k, v := range want {
		if eff[k] != v {
			t.Errorf("effective %s = %v, want %s (all: %v)", k, eff[k], v, eff)
		}
	}
}

// TestInstanceViewShowsWhenItsHoldsWereBroughtIn: a dead process's row shows swept_at once
// every hold it left was brought in, and not before. Mutant: swept_at left out.
func TestInstanceViewShowsWhenItsHoldsWereBroughtIn(t *testing.T) {
	f := newFixture(t, adminToken)
	for _, name := range []string{"swept", "unswept"} {
		in, err := f.store.RegisterInstance(f.ctx(), name, time.Second, time.Hour, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		q := "UPDATE instances SET dead_at = NOW(6) WHERE id = ?"
		if name == "swept" {
			q = "UPDATE instances SET dead_at = NOW(6), swept_at = NOW(6) WHERE id = ?"
		}
		if _, err := f.db.ExecContext(f.ctx(), q, in.ID()); err != nil {
			t.Fatal(err)
		}
	}
	rows, _ := f.admin("GET", "/admin/instances", nil, http.StatusOK)["data"].([]any)
	if len(rows) != 2 {
		t.Fatalf("instances %v, want 2", rows)
	}
	for _, row := range rows {
		r := row.(map[string]any)
		if _, ok := r["swept_at"]; ok != (r["name"] == "swept") {
			t.Errorf("%s: swept_at present %v", r["name"], ok)
		}
	}
}

// TestRunViewShowsItsHoldAndCapApart: a live run shows what it holds (the plan's normal hold,
// 20 credits) apart from its cap (max_run_cost, 500). Mutant: held shows the cap.
func TestRunViewShowsItsHoldAndCapApart(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "holder"}, http.StatusCreated)
	u, err := f.store.UserByName(f.ctx(), "holder")
	if err != nil {
		t.Fatal(err)
	}
	f.admitInOneBatch([]holds.AdmitRequest{{RunID: "r_capped", UserID: u.ID, Model: "gpt-a", State: holds.StateRunning, TTL: time.Minute}})
	runs, _ := f.admin("GET", "/admin/runs?user=holder", nil, http.StatusOK)["data"].([]any)
	if len(runs) != 1 {
		t.Fatalf("runs %v, want r_capped", runs)
	}
	if r := runs[0].(map[string]any); r["held"] != json.Number("20") || r["cap"] != json.Number("500") {
		t.Fatalf("live run %v, want held 20 and cap 500", r)
	}
}

// TestRevokeByPrefixCountsEveryKeyItRevoked: two live keys of a user may share the prefix a
// listing shows; revoking by it revokes both and says so. Mutant: keys_revoked capped at 1.
func TestRevokeByPrefixCountsEveryKeyItRevoked(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "twin"}, http.StatusCreated)
	k := f.admin("POST", "/admin/users/twin/keys", nil, http.StatusCreated)
	u, err := f.store.UserByName(f.ctx(), "twin")
	if err != nil {
		t.Fatal(err)
	}
	// A second key with the first's prefix: what two random keys share once in a while.
	twin := holds.HashKey(k["key"].(string) + "-twin")
	if _, err := f.db.ExecContext(f.ctx(), "INSERT INTO api_keys (key_hash, user_id, prefix) VALUES (?, ?, ?)", twin[:], u.ID, k["prefix"]); err != nil {
		t.Fatal(err)
	}
	out := f.admin("POST", "/admin/users/twin/keys/revoke", map[string]any{"prefix": k["prefix"]}, http.StatusOK)
	if out["keys_revoked"] != json.Number("2") {
		t.Fatalf("revoke of a prefix two keys share: %v, want keys_revoked 2", out)
	}
}

// TestUnknownParameterOnARouteThatTakesNoneSaysNone: a route that takes no query parameter
// says so by name, not with an empty list. Mutant: the "none" case dropped.
func TestUnknownParameterOnARouteThatTakesNoneSaysNone(t *testing.T) {
	f := newFixture(t, adminToken)
	out := f.admin("POST", "/admin/users?dry_run=1", map[string]any{"name": "nobody"}, http.StatusBadRequest)
	if msg := fmt.Sprint(out["error"]); errCode(out) != "unknown_parameter" || !strings.Contains(msg, "this route takes: none") {
		t.Fatalf("unknown parameter on a route that takes none: %v", out)
	}
}

// TestUsageReportCSVIsServedAsCSV: ?format=csv answers text/csv as an attachment named by
// its range, so a browser or curl -OJ saves it as a spreadsheet opens it. Mutant: the
// Content-Type changed.
func TestUsageReportCSVIsServedAsCSV(t *testing.T) {
	f := newFixture(t, adminToken)
	req, err := http.NewRequestWithContext(f.ctx(), http.MethodGet, f.url+"/admin/reports/usage?format=csv&from=2026-01-01&to=2026-01-31", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct, cd := resp.Header.Get("Content-Type"), resp.Header.Get("Content-Disposition"); resp.StatusCode != http.StatusOK ||
		ct != "text/csv; charset=utf-8" || cd != `attachment; filename="usage_2026-01-01_2026-01-31.csv"` {
		t.Fatalf("CSV report: %d, Content-Type %q, Content-Disposition %q", resp.StatusCode, ct, cd)
	}
}

// TestInternalErrorIsLoggedAsAnError: a request answered 500 internal_error is logged at
// error level, with its detail, which the answer leaves out; a refusal (4xx) is not. Mutant:
// the log's bound moved from >= 500 to > 500, so a 500 was logged as a refusal at info.
func TestInternalErrorIsLoggedAsAnError(t *testing.T) {
	f := newFixture(t, adminToken)
	core, logs := observer.New(zapcore.InfoLevel)
	r := chi.NewRouter()
	r.Mount("/admin", admin.New(f.store, 1000, adminToken, zap.New(core)))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	f.admin("POST", "/admin/users", map[string]any{"name": "logged"}, http.StatusCreated)
	// A table gone is no refusal and no outage: 500.
	if _, err := f.db.ExecContext(f.ctx(), "RENAME TABLE api_keys TO api_keys_away"); err != nil {
		t.Fatal(err)
	}
	out := f.admin("GET", "/admin/users/logged/keys", nil, http.StatusInternalServerError)
	if _, err := f.db.ExecContext(f.ctx(), "RENAME TABLE api_keys_away TO api_keys"); err != nil {
		t.Fatal(err)
	}
	if errCode(out) != "internal_error" {
		t.Fatalf("listing keys with their table gone: %v, want internal_error", out)
	}
	failed := logs.FilterMessage("admin request failed").All()
	if len(failed) != 1 || failed[0].Level != zapcore.ErrorLevel {
		t.Fatalf("logged %v, want one error-level \"admin request failed\"", logs.All())
	}
}
