package proxy

import "testing"

// TestFallbackLimitsBoundTheCall: the output a call sent without a bound may run to, and the
// bound added to it, count every model a router may answer it with. The worst case a named
// run's call reserves (outputBound) is the largest limit among them, none known when one of
// them has none; the bound added (addedBound) is needed when any of them may pass what the
// cap pays for (limit), and is then at most the least known limit among them.
func TestFallbackLimitsBoundTheCall(t *testing.T) {
	const asked = 16_384
	for _, tc := range []struct {
		name       string
		fallbacks  []int64 // their limits, 0 unknown
		limit      int64   // what the cap pays for, per answer
		worst      int64   // outputBound
		addedBound int64
	}{
		{"no fallbacks, within the cap", nil, 50_000, asked, 0},
		{"no fallbacks, past the cap", nil, 10_000, asked, 10_000},
		{"a larger fallback", []int64{128_000}, 50_000, 128_000, asked},
		{"a larger and a smaller fallback", []int64{128_000, 8_192}, 50_000, 128_000, 8_192},
		{"a larger fallback, the cap below both", []int64{128_000}, 10_000, 128_000, 10_000},
		{"a fallback of unknown limit", []int64{0}, 50_000, -1, asked},
		{"smaller fallbacks within the cap", []int64{8_192, 4_096}, 50_000, asked, 0},
	} {
		c := &callRequest{route: &route{maxFields: []string{"max_tokens"}}, maxOutput: -1, choices: 1}
		for _, l := range tc.fallbacks {
			c.fallbackLimits.add(l)
		}
		if got := c.outputBound(asked); got != tc.worst {
			t.Errorf("%s: outputBound %d, want %d", tc.name, got, tc.worst)
		}
		if got := c.addedBound(asked, tc.limit); got != tc.addedBound {
			t.Errorf("%s: addedBound %d, want %d", tc.name, got, tc.addedBound)
		}
		if got := c.addedBound(0, tc.limit); got != 0 {
			t.Errorf("%s: addedBound %d with the asked model's limit unknown, want none", tc.name, got)
		}
	}
}
