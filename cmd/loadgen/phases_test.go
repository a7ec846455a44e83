package main

import (
	"context"
	"math"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// The gateway's own /metrics, read before and after some calls, gives each phase's count,
// mean and bucket-interpolated percentiles of the calls in between only.
func TestPhaseDeltaFromGatewayMetrics(t *testing.T) {
	m := proxy.NewMetrics(nil)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	ctx := context.Background()

	m.CallPhase.WithLabelValues("admit").Observe(0.5) // before: must not count
	before := readPhases(ctx, srv.URL)
	if before == nil {
		t.Fatal("no phases read")
	}
	// 100 admissions: 98 at 0.15 ms (bucket 0.1–0.2 ms), 2 at 3 ms (bucket 1.6–3.2 ms).
	for range 98 {
		m.CallPhase.WithLabelValues("admit").Observe(0.00015)
	}
	for range 2 {
		m.CallPhase.WithLabelValues("admit").Observe(0.003)
	}
	m.CallPhase.WithLabelValues("upstream").Observe(100) // beyond the last bucket
	got := phaseDelta(before, readPhases(ctx, srv.URL))

	a := got["admit"]
	if a.N != 100 {
		t.Fatalf("admit n = %d, want 100 (%+v)", a.N, got)
	}
	if want := (98*0.15 + 2*3.0) / 100; math.Abs(a.Mean-want) > 0.001 {
		t.Errorf("admit mean %.4f ms, want %.4f", a.Mean, want)
	}
	// Rank 50 of 98 in [0.1, 0.2) ms; rank 99 is the first of the two in [1.6, 3.2) ms.
	if want := 0.1 + 0.1*50/98; math.Abs(a.P50-want) > 0.001 {
		t.Errorf("admit p50 %.4f ms, want %.4f", a.P50, want)
	}
	if want := 1.6 + (3.2-1.6)*1/2; math.Abs(a.P99-want) > 0.001 {
		t.Errorf("admit p99 %.4f ms, want %.4f", a.P99, want)
	}
	u := got["upstream"]
	if u.N != 1 || u.P99 != 3276.8 {
		t.Errorf("upstream beyond the last bucket: %+v, want n 1 and p99 at the largest bound 3276.8 ms", u)
	}
	if _, ok := got["checks"]; ok {
		t.Errorf("a phase with no calls in between is reported: %+v", got["checks"])
	}
}
