package admin_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestUsagePartsInRunViewsAndReport: a provider's invoice lists one-hour cache writes and
// audio tokens on lines of their own; the runs listing and the usage report showed only the
// totals they are part of, so a billing team could not set them against those lines. Each run
// shows its parts beside its totals, the report's rows and totals sum them, and the CSV adds
// them as its last columns, every earlier column where existing imports expect it.
func TestUsagePartsInRunViewsAndReport(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "cara"}, http.StatusCreated)
	u, err := f.store.UserByName(f.ctx(), "cara")
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]pricing.Usage{
		"r_spoken": {Input: 1040, AudioInput: 1000, Output: 300, AudioOutput: 250},
		"r_cached": {Input: 3, CacheRead: 1111, CacheWrite: 418, CacheWrite1h: 400, Output: 33},
		"r_text":   {Input: 10, Output: 5},
	}
	for _, id := range []string{"r_spoken", "r_cached", "r_text"} {
		if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: "gpt-a", State: holds.StateRunning,
			TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, Usage: runs[id], CostMicro: 100, Calls: 1,
			Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}

	listed := f.admin("GET", "/admin/runs?user=cara", nil, http.StatusOK)
	data, _ := listed["data"].([]any)
	if len(data) != len(runs) {
		t.Fatalf("runs %v", listed)
	}
	for _, r := range data {
		r := r.(map[string]any)
		usage, _ := r["usage"].(map[string]any)
		want := runs[r["id"].(string)]
		for key, n := range map[string]int64{"input": want.Input, "cache_write": want.CacheWrite, "output": want.Output,
			"cache_write_1h": want.CacheWrite1h, "audio_input": want.AudioInput, "audio_output": want.AudioOutput} {
			if usage[key] != json.Number(strconv.FormatInt(n, 10)) {
				t.Errorf("run %s usage %v: %s %v, want %d", r["id"], usage, key, usage[key], n)
			}
		}
	}

	day := f.settledDay() // not the default day: midnight may have passed since the settlement
	rep := f.admin("GET", "/admin/reports/usage?user=cara&from="+day+"&to="+day, nil, http.StatusOK)
	rows, _ := rep["data"].([]any)
	totals, _ := rep["totals"].(map[string]any)
	if len(rows) != 1 {
		t.Fatalf("report rows %v, want one (one user, day and model)", rows)
	}
	for _, m := range []map[string]any{rows[0].(map[string]any), totals} {
		if m["cache_write_1h_tokens"] != json.Number("400") || m["audio_input_tokens"] != json.Number("1000") ||
			m["audio_output_tokens"] != json.Number("250") || m["cache_write_tokens"] != json.Number("418") ||
			m["input_tokens"] != json.Number("1053") || m["output_tokens"] != json.Number("338") {
			t.Errorf("report %v: want 400 one-hour writes of 418, 1000 audio in of 1053, 250 audio out of 338", m)
		}
	}

	recs := f.csvReport(t)
	// The columns of before, in their places; the parts after them.
	before := []string{"user", "day", "model", "runs", "charged_runs", "calls", "input_tokens", "cache_read_tokens",
		"cache_write_tokens", "output_tokens", "cost", "charged", "allowance_part", "prepaid_part", "estimated_runs"}
	wantHeader := append(slices.Clone(before), "cache_write_1h_tokens", "audio_input_tokens", "audio_output_tokens")
	if !slices.Equal(recs[0], wantHeader) || !slices.Equal(admin.ReportCSVHeader, wantHeader) {
		t.Fatalf("CSV header %q, want %q", recs[0], wantHeader)
	}
	if len(recs) != 2 {
		t.Fatalf("CSV %q, want a header and one row", recs)
	}
	row := recs[1]
	if row[6] != "1053" || row[8] != "418" || row[9] != "338" || !slices.Equal(row[len(before):], []string{"400", "1000", "250"}) {
		t.Fatalf("CSV row %q: want input 1053, cache writes 418, output 338, then 400 one-hour writes, 1000 audio in, 250 audio out", row)
	}
}
