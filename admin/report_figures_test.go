package admin_test

import (
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestReportShowsEachFigureUnderItsName: a billing team reads the usage report by column
// name, in JSON and CSV, so each figure must sit under its own: a run's list cost apart from
// its charge (a discount between them), the charge's allowance part apart from its prepaid
// part, runs apart from charged runs (a release at 0) and from calls, estimated runs, and each
// token count and part apart. The expected figures are what the settlements said they did,
// shown in credits exactly (1000 micro-USD to the credit); rows and totals alike.
func TestReportShowsEachFigureUnderItsName(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "gus", "plan": "guest"}, http.StatusCreated)
	u, err := f.store.UserByName(f.ctx(), "gus")
	if err != nil {
		t.Fatal(err)
	}
	allowance := int64(5_000) // the second charge runs past it into prepaid credits
	if err := f.store.SetUserLimits(f.ctx(), u.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 1_000_000, IdempotencyKey: "gus-topup",
		Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	type figures map[string]int64 // by the report's column name; amounts in micro-USD
	want := map[string]figures{}
	total := figures{}
	runs := []struct {
		model     string
		cost      int64
		calls     int
		estimated bool
		usage     pricing.Usage
	}{
		{"m-x", 4_000, 3, true, pricing.Usage{Input: 101, CacheRead: 202, CacheWrite: 303, CacheWrite1h: 104, Output: 405, AudioInput: 6, AudioOutput: 7}},
		{"m-x", 3_000, 2, false, pricing.Usage{Input: 11, CacheRead: 12, CacheWrite: 13, CacheWrite1h: 4, Output: 15, AudioInput: 1, AudioOutput: 2}},
		{"m-x", 0, 4, false, pricing.Usage{}},
		{"m-y", 555, 1, true, pricing.Usage{Input: 21, CacheRead: 22, CacheWrite: 23, CacheWrite1h: 9, Output: 25, AudioInput: 3, AudioOutput: 8}},
	}
	for i, r := range runs {
		id := fmt.Sprintf("r_fig_%d", i)
		if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: r.model, State: holds.StateRunning,
			TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		res, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: r.cost, Calls: r.calls, Usage: r.usage,
			Estimated: r.estimated, Source: holds.SourceComplete})
		if err != nil || !res.Applied {
			t.Fatalf("settle %s: %+v, %v", id, res, err)
		}
		row := want[r.model]
		if row == nil {
			row = figures{}
			want[r.model] = row
		}
		for _, m := range []figures{row, total} {
			m["runs"]++
			if res.ChargedMicro > 0 {
				m["charged_runs"]++
			}
			if r.estimated {
				m["estimated_runs"]++
			}
			m["calls"] += int64(r.calls)
			m["input_tokens"] += r.usage.Input
			m["cache_read_tokens"] += r.usage.CacheRead
			m["cache_write_tokens"] += r.usage.CacheWrite
			m["output_tokens"] += r.usage.Output
			m["cache_write_1h_tokens"] += r.usage.CacheWrite1h
			m["audio_input_tokens"] += r.usage.AudioInput
			m["audio_output_tokens"] += r.usage.AudioOutput
			m["cost"] += res.CostMicro
			m["charged"] += res.ChargedMicro
			m["allowance_part"] += res.AllowancePart
			m["prepaid_part"] += res.PrepaidPart
		}
	}
	if x := want["m-x"]; x["cost"] == x["charged"] || x["allowance_part"] == 0 || x["prepaid_part"] == 0 || x["runs"] == x["charged_runs"] {
		t.Fatalf("m-x's figures %v: want a discount, both parts and a release, so that each figure differs", x)
	}
	money := map[string]bool{"cost": true, "charged": true, "allowance_part": true, "prepaid_part": true}
	// shown is how the report shows a figure: a count as an integer, an amount in credits.
	shown := func(name string, n int64) string {
		if money[name] {
			return new(big.Rat).SetFrac64(n, 1000).RatString()
		}
		return strconv.FormatInt(n, 10)
	}
	read := func(name, s string) string {
		if money[name] {
			v, ok := new(big.Rat).SetString(s)
			if !ok {
				return "not a decimal: " + s
			}
			return v.RatString()
		}
		return s
	}

	day := f.settledDay() // not the default day: midnight may have passed since the settlement
	rep := f.admin("GET", "/admin/reports/usage?user=gus&from="+day+"&to="+day, nil, http.StatusOK)
	data, _ := rep["data"].([]any)
	if len(data) != len(want) {
		t.Fatalf("JSON rows %v, want one per model", data)
	}
	check := func(where string, got func(string) (string, bool), w figures) {
		t.Helper()
		for name, n := range w {
			s, ok := got(name)
			if !ok || read(name, s) != shown(name, n) {
				t.Errorf("%s: %s is %q (present %v), want %s", where, name, s, ok, shown(name, n))
			}
		}
	}
	fromJSON := func(m map[string]any) func(string) (string, bool) {
		return func(name string) (string, bool) {
			v, ok := m[name].(json.Number)
			return string(v), ok
		}
	}
	for _, r := range data {
		m := r.(map[string]any)
		model, _ := m["model"].(string)
		check("JSON row "+model, fromJSON(m), want[model])
	}
	totals, _ := rep["totals"].(map[string]any)
	check("JSON totals", fromJSON(totals), total)
	led, _ := rep["ledger"].(map[string]any)
	check("JSON ledger", fromJSON(led), figures{"charged": total["charged"], "charged_runs": total["charged_runs"]})

	recs := f.csvReport(t)
	if len(recs) != 1+len(want) {
		t.Fatalf("CSV %q, want a header and one row per model", recs)
	}
	for _, rec := range recs[1:] {
		if len(rec) != len(recs[0]) {
			t.Fatalf("CSV row %q: %d cells under %d columns", rec, len(rec), len(recs[0]))
		}
		check("CSV row "+rec[2], func(name string) (string, bool) {
			for i, col := range recs[0] {
				if col == name {
					return rec[i], true
				}
			}
			return "", false
		}, want[rec[2]])
	}
}
