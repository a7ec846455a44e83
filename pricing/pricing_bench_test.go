package pricing

import "testing"

// Hot-path pricing: every call is looked up, its output bound computed and its cost taken.

var benchPrice = Price{Input: 2_500_000, CacheRead: 1_250_000, CacheWrite: 3_125_000, Output: 10_000_000}

func BenchmarkCostAllFields(b *testing.B) {
	u := Usage{Input: 1234, CacheRead: 512, CacheWrite: 64, Output: 789}
	var sink int64
	for b.Loop() {
		sink += benchPrice.Cost(u)
	}
	_ = sink
}

func BenchmarkMaxOutputWithin(b *testing.B) {
	var sink int64
	for b.Loop() {
		sink += benchPrice.MaxOutputWithin(Usage{Input: 1234}, 500_000)
	}
	_ = sink
}

func BenchmarkApplyDiscount(b *testing.B) {
	var sink int64
	for b.Loop() {
		sink += ApplyDiscount(123_457, 1500)
	}
	_ = sink
}

func BenchmarkLookup(b *testing.B) {
	t, err := NewTable(map[string]Price{"fake-gpt": benchPrice, "gpt-4o": benchPrice, "gpt-4o-mini": benchPrice,
		"claude-3-5-sonnet": benchPrice, "o1": benchPrice})
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range []string{"fake-gpt", "gpt-4o-2024-08-06"} {
		b.Run(m, func(b *testing.B) {
			for b.Loop() {
				if _, _, err := t.Lookup(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
