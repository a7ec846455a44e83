package admin_test

import (
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestRunsListPagesWithoutLosingRuns: an operator pages GET /admin/runs (newest first) the
// only way the API allows, by passing the oldest created_at seen as until. Runs admitted in
// one batch (the proxy groups concurrent admissions into one INSERT) share created_at, and
// the next page skips every one of them past the first page.
func TestRunsListPagesWithoutLosingRuns(t *testing.T) {
	f := newFixture(t, adminToken)
	var reqs []holds.AdmitRequest
	for i := range 5 {
		name := fmt.Sprintf("u%d", i)
		f.admin("POST", "/admin/users", map[string]any{"name": name}, http.StatusCreated)
		u, err := f.store.UserByName(f.ctx(), name)
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, holds.AdmitRequest{RunID: fmt.Sprintf("r_%d", i), UserID: u.ID, Model: "m",
			State: holds.StateRunning, TTL: time.Minute})
	}
	f.admitInOneBatch(reqs)

	seen := map[string]bool{}
	path := "/admin/runs?limit=2"
	for page := 0; page < 10; page++ {
		res := f.admin("GET", path, nil, http.StatusOK)
		data, _ := res["data"].([]any)
		if len(data) == 0 {
			break
		}
		last := data[len(data)-1].(map[string]any)
		for _, r := range data {
			seen[r.(map[string]any)["id"].(string)] = true
		}
		// The documented way to go on: until = the oldest created_at seen (or, with a
		// cursor, whatever the answer says to send next).
		if next, ok := res["last_id"].(string); ok {
			path = "/admin/runs?limit=2&after=" + url.QueryEscape(next)
		} else {
			path = "/admin/runs?limit=2&until=" + url.QueryEscape(last["created_at"].(string))
		}
	}
	if len(seen) != len(reqs) {
		var got []string
		for id := range seen {
			got = append(got, id)
		}
		sort.Strings(got)
		t.Fatalf("paging GET /admin/runs by 2 returned %d of %d runs: %v", len(seen), len(reqs), got)
	}
}

// TestReportCreditsExactAtAnyCreditMicro: config accepts any positive credit_micro (a credit
// of $5 is 5 000 000 micro-USD), and the report must still show each charge exactly, so that
// a spreadsheet's sum of the CSV's charged column equals the day ledger.
func TestReportCreditsExactAtAnyCreditMicro(t *testing.T) {
	const creditMicro = 5_000_000
	db := testenv.MySQL(t)
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	st := holds.NewStore(db, plans(), "standard", log)
	r := chi.NewRouter()
	r.Mount("/admin", admin.New(st, creditMicro, adminToken, log))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	f := &fixture{t: t, db: db, store: st, url: srv.URL}

	u, err := st.CreateUser(f.ctx(), "acme", "standard")
	if err != nil {
		t.Fatal(err)
	}
	for i, model := range []string{"m-a", "m-b", "m-c"} {
		id := fmt.Sprintf("r_%d", i)
		if _, err := st.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: model, State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: 3, Calls: 1, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	recs := f.csvReport(t)
	sum := new(big.Rat)
	for _, rec := range recs[1:] {
		v, ok := new(big.Rat).SetString(rec[11])
		if !ok {
			t.Fatalf("charged %q is not a decimal", rec[11])
		}
		sum.Add(sum, v)
	}
	want := big.NewRat(9, creditMicro) // the ledger: 3 runs × 3 micro-USD
	if sum.Cmp(want) != 0 {
		t.Fatalf("CSV charged column sums to %s credits, the ledger holds %s credits (9 micro-USD); rows: %q",
			sum.FloatString(9), want.FloatString(9), recs)
	}
	day := f.settledDay() // not the default day: midnight may have passed since the settlements
	rep := f.admin("GET", "/admin/reports/usage?from="+day+"&to="+day, nil, http.StatusOK)
	led, _ := rep["ledger"].(map[string]any)
	if v, ok := new(big.Rat).SetString(string(led["charged"].(json.Number))); !ok || v.Cmp(want) != 0 {
		t.Fatalf("JSON ledger shows %v credits, want %s", led["charged"], want.FloatString(9))
	}
}
