package main

import (
	"context"
	"math"
	"net/http/httptest"
	"slices"
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
	// 100 admissions: 98 at 0.15 ms, 2 at 3 ms.
	for range 98 {
		m.CallPhase.WithLabelValues("admit").Observe(0.00015)
	}
	for range 2 {
		m.CallPhase.WithLabelValues("admit").Observe(0.003)
	}
	m.CallPhase.WithLabelValues("upstream").Observe(100) // beyond the last bucket
	after := readPhases(ctx, srv.URL)
	got := phaseDelta(before, after)

	a := got["admit"]
	if a.N != 100 {
		t.Fatalf("admit n = %d, want 100 (%+v)", a.N, got)
	}
	if want := (98*0.15 + 2*3.0) / 100; math.Abs(a.Mean-want) > 0.001 {
		t.Errorf("admit mean %.4f ms, want %.4f", a.Mean, want)
	}
	bounds := finiteBounds(after["admit"])
	// Rank 50 of the 98 in the bucket around 0.15 ms; rank 99 is the first of the two in the
	// bucket around 3 ms.
	lo, hi := bucketAround(t, bounds, 0.15)
	if want := lo + (hi-lo)*50/98; math.Abs(a.P50-want) > 0.001 {
		t.Errorf("admit p50 %.4f ms, want %.4f (bucket %.4f–%.4f)", a.P50, want, lo, hi)
	}
	lo, hi = bucketAround(t, bounds, 3)
	if want := lo + (hi-lo)*1/2; math.Abs(a.P99-want) > 0.001 {
		t.Errorf("admit p99 %.4f ms, want %.4f (bucket %.4f–%.4f)", a.P99, want, lo, hi)
	}
	u := got["upstream"]
	if last := bounds[len(bounds)-1]; u.N != 1 || math.Abs(u.P99-last) > 0.001 {
		t.Errorf("upstream beyond the last bucket: %+v, want n 1 and p99 at the largest bound %.1f ms", u, last)
	}
	if _, ok := got["checks"]; ok {
		t.Errorf("a phase with no calls in between is reported: %+v", got["checks"])
	}
}

// The gateway's latency buckets are fine enough that a percentile read from them is close:
// each bound at most 30 % above the one before, from at most 0.5 ms up to at least 2 s, for
// the call phases and the settlement's commit alike (with bounds doubling, a settlement
// p99 inside 32–64 ms could not be told from the 50 ms target).
func TestGatewayLatencyBucketsAreFine(t *testing.T) {
	m := proxy.NewMetrics(nil)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	m.CallPhase.WithLabelValues("admit").Observe(0.001)
	m.SettleSeconds.Observe(0.001)
	got := readPhases(context.Background(), srv.URL)
	for _, name := range []string{"admit", settleKey} {
		b := finiteBounds(got[name])
		if len(b) == 0 || b[0] > 0.5 || b[len(b)-1] < 2000 {
			t.Errorf("%s: bounds %v ms do not span 0.5 ms to 2 s", name, b)
			continue
		}
		for i := 1; i < len(b); i++ {
			if b[i] > 1.3*b[i-1] {
				t.Errorf("%s: bound %.3f ms is %.2f × the one before", name, b[i], b[i]/b[i-1])
				break
			}
		}
	}
}

// finiteBounds is a histogram's finite bucket bounds in milliseconds, in order.
func finiteBounds(h *histogram) []float64 {
	if h == nil {
		return nil
	}
	var b []float64
	for le := range h.buckets {
		if !math.IsInf(le, 1) {
			b = append(b, le*1000)
		}
	}
	slices.Sort(b)
	return b
}

// bucketAround is the bucket (lower, upper bound in ms) that holds v ms.
func bucketAround(t *testing.T, bounds []float64, v float64) (lo, hi float64) {
	t.Helper()
	for i, b := range bounds {
		if v <= b {
			if i > 0 {
				lo = bounds[i-1]
			}
			return lo, b
		}
	}
	t.Fatalf("%.3f ms beyond every bound %v", v, bounds)
	return 0, 0
}
