package admin_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

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
	rep := f.admin("GET", "/admin/reports/usage?user=ann", nil, http.StatusOK)
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
