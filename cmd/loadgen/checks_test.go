package main

import "testing"

func checkOf(t *testing.T, rep *Report, scenario, what string) Check {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Scenario == scenario && c.What == what {
			return c
		}
	}
	t.Fatalf("no check %s %q in %+v", scenario, what, rep.Checks)
	return Check{}
}

// A ratio of 0.34996 is below the 0.35: rounding the value for display must not
// turn it into a pass.
func TestThroughputRatioJustBelowTargetFails(t *testing.T) {
	runs := []*Run{
		{Scenario: "users-256", Target: "plain", Requests: 1, OK: 1, RPS: 10000},
		{Scenario: "users-256", Target: "tollgate", Requests: 1, OK: 1, RPS: 3499.6},
	}
	if c := checkOf(t, report(runs), "users-256", "throughput / plain proxy"); c.Pass {
		t.Errorf("ratio 0.34996 passed >= 0.35: %+v", c)
	}
}

// Added latency of 1.0004 ms is above the 1 ms.
func TestAddedLatencyJustAboveTargetFails(t *testing.T) {
	runs := []*Run{
		{Scenario: "latency-1conn", Target: "direct", Requests: 1, OK: 1, lat: []float64{0.1}},
		{Scenario: "latency-1conn", Target: "tollgate", Requests: 1, OK: 1, lat: []float64{1.1004}},
	}
	if c := checkOf(t, report(runs), "latency-1conn", "added latency p50 (ms)"); c.Pass {
		t.Errorf("added 1.0004 ms passed <= 1: %+v", c)
	}
}

// Latency and settlement lag are taken over the answered calls only: a run where calls
// failed has measured a subset, and its figure must not pass.
func TestLatencyAndSettleLagFailWhenCallsFailed(t *testing.T) {
	runs := []*Run{
		{Scenario: "latency-1conn", Target: "direct", Requests: 2, OK: 2, lat: []float64{0.1, 0.1}},
		{Scenario: "latency-1conn", Target: "tollgate", Requests: 2, OK: 1, lat: []float64{0.5},
			Errors: map[string]int{"status 503": 1}},
		{Scenario: "settle-lag", Target: "tollgate", Requests: 10, OK: 5, Errors: map[string]int{"status 503": 5},
			SettleLag: &Dist{N: 5, P99: 3}},
	}
	rep := report(runs)
	for _, w := range [][2]string{{"latency-1conn", "added latency p50 (ms)"}, {"latency-1conn", "added latency p99 (ms)"},
		{"settle-lag", "settlement lag p99 (ms)"}} {
		if c := checkOf(t, rep, w[0], w[1]); c.Pass {
			t.Errorf("%s %q passed with failed calls: %+v", w[0], w[1], c)
		}
	}
}
