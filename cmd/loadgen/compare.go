package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// compareCmd prints an A/B comparison of bench results: `loadgen compare -base a1.json,a2.json
// -head b1.json,b2.json`, the i-th file of each list run back to back with the other's
// (scripts/bench-ab.sh). On this shared hardware a figure moves from run to run by more than
// most changes cost, so a change is judged pair by pair: for each target, the values of both
// sides and in how many pairs the head did better and worse.
func compareCmd(args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	base := fs.String("base", "", "comma-separated result files of the code before the change")
	head := fs.String("head", "", "comma-separated result files of the code after it, paired in order with -base")
	if err := fs.Parse(args); err != nil {
		return err
	}
	bases, heads := splitList(*base), splitList(*head)
	if len(bases) == 0 || len(bases) != len(heads) {
		return fmt.Errorf("compare: want as many -head files as -base files, at least one (got %d and %d)", len(bases), len(heads))
	}
	var pairs [][2]*Report
	for i := range bases {
		b, err := readReport(bases[i])
		if err != nil {
			return err
		}
		h, err := readReport(heads[i])
		if err != nil {
			return err
		}
		pairs = append(pairs, [2]*Report{b, h})
	}
	compare(os.Stdout, pairs)
	return nil
}

// compare writes one row per check that both sides of a pair measured, in the order of the
// base reports' checks: both sides' values, pair by pair, and in how many pairs the head did
// better and worse (the rest are ties).
func compare(w io.Writer, pairs [][2]*Report) {
	type key struct{ scenario, what string }
	byKey := func(r *Report) map[key]Check {
		m := map[key]Check{}
		for _, c := range rowsOf(r) {
			m[key{c.Scenario, c.What}] = c
		}
		return m
	}
	var order []key
	seen := map[key]bool{}
	sides := make([][2]map[key]Check, len(pairs))
	for i, p := range pairs {
		for _, c := range rowsOf(p[0]) {
			if k := (key{c.Scenario, c.What}); !seen[k] {
				seen[k] = true
				order = append(order, k)
			}
		}
		sides[i] = [2]map[key]Check{byKey(p[0]), byKey(p[1])}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tcheck\ttarget\tbase\thead\thead better\thead worse")
	for _, k := range order {
		var target string
		var bs, hs []string
		better, worse, n := 0, 0, 0
		for _, side := range sides {
			b, bok := side[0][k]
			h, hok := side[1][k]
			if !bok || !hok {
				continue
			}
			target = b.Target
			bs, hs = append(bs, fmt.Sprint(b.Value)), append(hs, fmt.Sprint(h.Value))
			n++
			switch {
			case improved(b.Target, b.Value, h.Value):
				better++
			case improved(b.Target, h.Value, b.Value):
				worse++
			}
		}
		if n == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d of %d\t%d of %d\n", k.scenario, k.what, target,
			strings.Join(bs, " "), strings.Join(hs, " "), better, n, worse, n)
	}
	tw.Flush()
}

// improved says whether head is better than base for a row of target: lower for "<= x", "== 0"
// (errors) and a phase's "lower", higher for ">= x"; a pass/fail check (target "pass", values
// 1 and 0) is better at 1. A target of any other form has no better side.
func improved(target string, base, head float64) bool {
	switch {
	case strings.HasPrefix(target, "<="), target == "== 0", target == phaseTarget:
		return head < base
	case strings.HasPrefix(target, ">="), target == "pass":
		return head > base
	}
	return false
}

// rowsOf is what compare shows of a report: its checks, then the p50 of each phase of the
// gateway's own histogram in each tollgate scenario's first round, which tell where a change
// moved the time (an admission's queue or its transaction, the upstream's answer).
func rowsOf(r *Report) []Check {
	rows := append([]Check(nil), r.Checks...)
	seen := map[string]bool{}
	for _, run := range r.Runs {
		if run.Target != "tollgate" || len(run.GatewayPhases) == 0 || seen[run.Scenario] {
			continue
		}
		seen[run.Scenario] = true
		for _, name := range phaseNames {
			if d, ok := run.GatewayPhases[name]; ok {
				rows = append(rows, Check{Scenario: run.Scenario, What: "gateway phase " + name + " p50 (ms)", Target: phaseTarget, Value: d.P50})
			}
		}
	}
	return rows
}

// phaseTarget marks a phase's row: no target of the issue, lower is better.
const phaseTarget = "lower"

// phaseNames are the gateway's call phases in a call's order (tollgate_call_phase_seconds).
var phaseNames = []string{"auth", "body", "admit", "admit_queue", "admit_tx", "checks", "upstream", "first_event"}

func readReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("compare: %w", err)
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("compare: %s: %w", path, err)
	}
	if len(r.Checks) == 0 {
		return nil, fmt.Errorf("compare: %s: %w", path, errNoChecks)
	}
	return &r, nil
}

var errNoChecks = errors.New("no checks: not a bench result")

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
