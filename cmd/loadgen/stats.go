package main

import (
	"math"
	"slices"
)

// Dist summarises a sample with exact percentiles: every value is kept and sorted, nothing
// is bucketed. Values are milliseconds.
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Min  float64 `json:"min_ms"`
	Max  float64 `json:"max_ms"`
}

func distOf(v []float64) Dist {
	if len(v) == 0 {
		return Dist{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Dist{N: len(s), Mean: sum / float64(len(s)), P50: pct(s, 50), P90: pct(s, 90), P99: pct(s, 99),
		P999: pct(s, 99.9), Min: s[0], Max: s[len(s)-1]}
}

// pct is the nearest-rank percentile of a sorted sample: the ceil(p/100 × n)-th smallest.
// The product is computed as p × n / 100 less a hair, because in floating point 99.9/100 × 1000
// is 999.0000000000001 and its ceiling would take the next rank (at n = 1000, the maximum).
func pct(s []float64, p float64) float64 {
	rank := int(math.Ceil(p*float64(len(s))/100 - 1e-9))
	return s[max(0, min(len(s)-1, rank-1))]
}
