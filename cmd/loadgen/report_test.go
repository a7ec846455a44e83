package main

import "testing"

// A target that answered nothing must fail its checks, not pass them with zeros.
func TestReportChecksFailWithoutSamples(t *testing.T) {
	runs := []*Run{
		{Scenario: "latency-1conn", Target: "direct", Requests: 3, OK: 3, lat: []float64{0.2, 0.3, 0.4}},
		{Scenario: "latency-1conn", Target: "tollgate", Requests: 3, OK: 0, Errors: map[string]int{"status 401": 3}},
		{Scenario: "streams-512", Target: "direct", Requests: 1, OK: 1, lat: []float64{2000}, ttfb: []float64{1}},
		{Scenario: "streams-512", Target: "tollgate"},
		{Scenario: "streams-burst", Target: "tollgate"},
		{Scenario: "settle-lag", Target: "tollgate", SettleLag: &Dist{N: 5, P99: 3}, LagMissing: 2},
	}
	rep := report(runs)
	seen := map[string]int{}
	for _, c := range rep.Checks {
		seen[c.Scenario]++
		if c.Pass {
			t.Errorf("%s %q passed: %+v", c.Scenario, c.What, c)
		}
	}
	for _, sc := range []string{"latency-1conn", "streams-512", "streams-burst", "settle-lag"} {
		if seen[sc] == 0 {
			t.Errorf("%s: no check emitted", sc)
		}
	}
}
