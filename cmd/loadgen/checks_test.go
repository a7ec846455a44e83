package main

import (
	"net/http"
	"testing"
)

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

// TTFB is taken over the answered streams only, like latency: a stream that failed its check
// (or was cut after its first line) is an error, not a sample of the figure.
func TestTTFBIsTakenOverAnsweredStreamsOnly(t *testing.T) {
	run := &Run{Errors: map[string]int{}}
	run.count([]sample{
		{ok: true, status: http.StatusOK, lat: 2e9, ttfb: 3e6},
		{status: http.StatusOK, errKind: "stream check", lat: 2e9, ttfb: 1e6, lost: 4},
	})
	if len(run.ttfb) != 1 || run.ttfb[0] != 3 {
		t.Errorf("ttfb samples %v ms, want [3]: the failed stream's first line counted", run.ttfb)
	}
	if run.Streams == nil || run.Streams.Streams != 2 || run.Streams.Lost != 4 {
		t.Errorf("stream check %+v, want both streams counted and 4 events lost", run.Streams)
	}
}

// The added TTFB is over the answered streams only: a run in which streams failed (refused
// fast, or cut) measured a subset, on either side of the difference, and must not pass.
func TestAddedTTFBFailsWhenStreamsFailed(t *testing.T) {
	direct := func(errs int) *Run {
		return &Run{Scenario: "streams-512", Target: "direct", Requests: 4, OK: 4 - errs, ttfb: []float64{5, 5, 5, 5}[errs:],
			Errors: map[string]int{"status 503": errs}}
	}
	tollgate := func(errs int) *Run {
		return &Run{Scenario: "streams-512", Target: "tollgate", Requests: 4, OK: 4 - errs, ttfb: []float64{5.5, 5.5, 5.5, 5.5}[errs:],
			Errors: map[string]int{"status 503": errs}}
	}
	if c := checkOf(t, report([]*Run{direct(0), tollgate(0)}), "streams-512", "added TTFB p99 (ms)"); !c.Pass {
		t.Fatalf("added 0.5 ms with every stream answered failed: %+v", c)
	}
	for _, errs := range [][2]int{{0, 2}, {2, 0}} {
		rep := report([]*Run{direct(errs[0]), tollgate(errs[1])})
		if c := checkOf(t, rep, "streams-512", "added TTFB p99 (ms)"); c.Pass {
			t.Errorf("errors direct %d, tollgate %d: added TTFB passed on a subset: %+v", errs[0], errs[1], c)
		}
	}
}

// Tollgate's throughput is compared with the plain proxy's as the floor of a Go proxy: a plain
// proxy that failed calls answered fewer than it can, and the ratio over it flatters tollgate.
func TestThroughputRatioFailsWhenThePlainProxyFailed(t *testing.T) {
	runs := []*Run{
		{Scenario: "users-256", Target: "plain", Requests: 100, OK: 50, RPS: 5000, Errors: map[string]int{"transport: EOF": 50}},
		{Scenario: "users-256", Target: "tollgate", Requests: 40, OK: 40, RPS: 4000},
	}
	if c := checkOf(t, report(runs), "users-256", "throughput / plain proxy"); c.Pass {
		t.Errorf("ratio over a plain proxy that failed half its calls passed: %+v", c)
	}
	runs[0].OK, runs[0].Errors = 100, nil
	if c := checkOf(t, report(runs), "users-256", "throughput / plain proxy"); !c.Pass {
		t.Errorf("ratio 0.8 over a plain proxy without errors failed: %+v", c)
	}
}
