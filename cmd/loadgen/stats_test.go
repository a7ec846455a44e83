package main

import "testing"

// p99.9 of 1000 samples is the 999th smallest, not the largest: the rank is ceil(p/100 × n)
// in exact arithmetic, and 99.9/100 × 1000 is 999.0000000000001 in floating point.
func TestPctIsNearestRankWithoutFloatDrift(t *testing.T) {
	for _, n := range []int{1000, 2000, 3000, 6000, 100, 7} {
		s := make([]float64, n)
		for i := range s {
			s[i] = float64(i + 1) // value == rank
		}
		for _, p := range []float64{50, 90, 99, 99.9} {
			want := float64((int64(p*10+0.5)*int64(n) + 999) / 1000)
			if got := pct(s, p); got != want {
				t.Errorf("n %d p%v: rank %v, want %v", n, p, got, want)
			}
		}
	}
}

// A negative figure (a settlement committed before the client read its last byte) rounds
// like a positive one.
func TestRoundHalfAwayFromZero(t *testing.T) {
	if got := round3(-0.0016); got != -0.002 {
		t.Errorf("round3(-0.0016) = %v, want -0.002", got)
	}
	if got := round2(-1.006); got != -1.01 {
		t.Errorf("round2(-1.006) = %v, want -1.01", got)
	}
}
