package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompareCountsPairsEachWay: each check's row shows both sides' values pair by pair and
// counts the pairs the head did better and worse in, by the direction of its target (lower
// for "<=" and "== 0", higher for ">=", 1 for "pass"); a pair where one side lacks the check
// is left out of its row.
func TestCompareCountsPairsEachWay(t *testing.T) {
	rep := func(p50, ratio, errs, lag float64, withLag bool) *Report {
		r := &Report{Checks: []Check{
			{Scenario: "latency-1conn", What: "added latency p50 (ms)", Target: "<= 1", Value: p50},
			{Scenario: "users-256", What: "throughput / plain proxy", Target: ">= 0.35", Value: ratio},
			{Scenario: "users-256", What: "errors", Target: "== 0", Value: errs},
			{Scenario: "all", What: "ledger", Target: "pass", Value: 1},
		}}
		if withLag {
			r.Checks = append(r.Checks, Check{Scenario: "settle-lag", What: "settlement lag p99 (ms)", Target: "<= 50", Value: lag})
		}
		return r
	}
	pairs := [][2]*Report{
		{rep(2.2, 0.38, 0, 40, true), rep(2.4, 0.41, 0, 30, true)},
		{rep(1.8, 0.36, 2, 45, true), rep(1.7, 0.40, 0, 50, false)},
	}
	var out strings.Builder
	compare(&out, pairs)
	want := map[string][]string{
		"added latency p50 (ms)":   {"2.2 1.8", "2.4 1.7", "1 of 2", "1 of 2"},
		"throughput / plain proxy": {"0.38 0.36", "0.41 0.4", "2 of 2", "0 of 2"},
		"errors":                   {"0 2", "0 0", "1 of 2", "0 of 2"},
		"ledger":                   {"1 1", "1 1", "0 of 2", "0 of 2"},
		"settlement lag p99 (ms)":  {"40", "30", "1 of 1", "0 of 1"},
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1+len(want) {
		t.Fatalf("%d lines, want a header and %d rows:\n%s", len(lines), len(want), out.String())
	}
	for what, cells := range want {
		var row string
		for _, l := range lines {
			if strings.Contains(l, what) {
				row = l
			}
		}
		if row == "" {
			t.Errorf("no row for %q:\n%s", what, out.String())
			continue
		}
		// Cells are separated by two spaces or more (tabwriter's padding).
		rest := row[strings.Index(row, what)+len(what):]
		var got []string
		for _, f := range strings.Split(rest, "  ") {
			if f = strings.TrimSpace(f); f != "" {
				got = append(got, f)
			}
		}
		if len(got) != 5 || strings.Join(got[1:], "|") != strings.Join(cells, "|") {
			t.Errorf("row for %q: %q, want target then %q", what, got, cells)
		}
	}
}

// TestCompareRefusesUnpairedOrForeignFiles: the lists must pair up, and a file must be a bench
// result (it has checks): a typo must not compare one run against nothing.
func TestCompareRefusesUnpairedOrForeignFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	data, err := json.Marshal(Report{Checks: []Check{{Scenario: "s", What: "w", Target: "<= 1", Value: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, data, 0o644); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign.json")
	if err := os.WriteFile(foreign, []byte(`{"runs":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"unpaired":  {"-base", good + "," + good, "-head", good},
		"empty":     {"-base", "", "-head", ""},
		"foreign":   {"-base", good, "-head", foreign},
		"no such":   {"-base", good, "-head", filepath.Join(dir, "missing.json")},
		"no values": {"-base", ",", "-head", ","},
	} {
		if err := compareCmd(args); err == nil {
			t.Errorf("%s: compare %q accepted", name, args)
		}
	}
}

// TestComparePhaseRowsAreTheFirstTollgateRounds: after the checks come the p50 of the
// gateway's phases, from each scenario's first tollgate round (not a later round's, nor
// another target's), lower being better: where a change moved the time.
func TestComparePhaseRowsAreTheFirstTollgateRounds(t *testing.T) {
	rep := func(tx float64) *Report {
		phases := func(v float64) map[string]PhaseDist {
			return map[string]PhaseDist{"admit_tx": {N: 1, P50: v}, "not_a_phase": {N: 1, P50: 9}}
		}
		return &Report{
			Checks: []Check{{Scenario: "latency-1conn", What: "added latency p50 (ms)", Target: "<= 1", Value: 2}},
			Runs: []*Run{
				{Scenario: "latency-1conn", Target: "plain", Round: 1, GatewayPhases: phases(100)},
				{Scenario: "latency-1conn", Target: "tollgate", Round: 1, GatewayPhases: phases(tx)},
				{Scenario: "latency-1conn", Target: "tollgate", Round: 2, GatewayPhases: phases(100)},
			},
		}
	}
	var out strings.Builder
	compare(&out, [][2]*Report{{rep(1.5), rep(1.2)}, {rep(1.4), rep(1.6)}})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want a header, the check and one phase:\n%s", len(lines), out.String())
	}
	row := strings.Fields(lines[2])
	want := []string{"latency-1conn", "gateway", "phase", "admit_tx", "p50", "(ms)", "lower", "1.5", "1.4", "1.2", "1.6", "1", "of", "2", "1", "of", "2"}
	if strings.Join(row, " ") != strings.Join(want, " ") {
		t.Fatalf("phase row %q, want %q", row, want)
	}
}
