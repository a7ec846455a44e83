package proxy

import (
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestTalliedAsSettledComparesEveryFigureTheTallyHolds: a plain call's tally written with its
// fingerprint (its final event's figures) is set again beside the settlement unless it already
// says all the settlement charges — its tokens, its cost, its estimated mark and its prices.
// One that differs in any of them alone is not as settled: left, the reconciler settling the
// run from it (the settlement failed too) marks an estimated call as reported, or the reverse,
// or records prices the call was not billed at.
func TestTalliedAsSettledComparesEveryFigureTheTallyHolds(t *testing.T) {
	tallied := holds.Settlement{Usage: pricing.Usage{Input: 10, Output: 5}, CostMicro: 75, Estimated: true,
		PriceSnapshot: []byte(`{"m":1}`)}
	if !talliedAsSettled(tallied, tallied) {
		t.Fatal("a tally of the very figures settled is not as settled")
	}
	for name, change := range map[string]func(*holds.Settlement){
		"tokens":         func(st *holds.Settlement) { st.Usage.Output = 50 },
		"cost":           func(st *holds.Settlement) { st.CostMicro = 76 },
		"estimated mark": func(st *holds.Settlement) { st.Estimated = false },
		"prices":         func(st *holds.Settlement) { st.PriceSnapshot = []byte(`{"m":2}`) },
		"no prices":      func(st *holds.Settlement) { st.PriceSnapshot = nil },
	} {
		st := tallied
		change(&st)
		if talliedAsSettled(tallied, st) {
			t.Errorf("settlement differing in its %s alone: tally taken as settled, not set again", name)
		}
	}
}
