package pricing

import (
	"errors"
	"math/big"
	"strings"
	"testing"
)

func TestCostIsExactAndRoundedUpOncePerCall(t *testing.T) {
	// Prices in micro-USD per million tokens: 2.50, 1.25, 3.125 and 10.00 USD/M.
	p := Price{Input: 2_500_000, CacheRead: 1_250_000, CacheWrite: 3_125_000, Output: 10_000_000}
	for _, tc := range []struct {
		name string
		u    Usage
		want int64
	}{
		{"nothing", Usage{}, 0},
		// 1 input token = 2.5 µUSD -> 3 after the one rounding.
		{"one input token", Usage{Input: 1}, 3},
		// 2 input tokens = exactly 5 µUSD.
		{"two input tokens", Usage{Input: 2}, 5},
		// 1 + 1 input tokens in one call round once (5), not twice (3 + 3).
		{"rounding once", Usage{Input: 1, CacheRead: 2}, 5}, // 2.5 + 2.5 = 5
		// 1000 in, 200 cache read, 8 cache write, 500 out:
		// 2500 + 250 + 25 + 5000 = 7775 µUSD.
		{"every field", Usage{Input: 1000, CacheRead: 200, CacheWrite: 8, Output: 500}, 7775},
		// 3 cache-write tokens = 9.375 -> 10.
		{"cache write fraction", Usage{CacheWrite: 3}, 10},
		// A million output tokens = 10 USD = 10,000,000 µUSD.
		{"a million output", Usage{Output: 1_000_000}, 10_000_000},
		{"negative clamped", Usage{Input: -50, Output: 1}, 10},
	} {
		if got := p.Cost(tc.u); got != tc.want {
			t.Errorf("%s: Cost(%+v) = %d, want %d", tc.name, tc.u, got, tc.want)
		}
	}
}

// TestOneHourCacheWritesAtTheirOwnPrice: Anthropic bills a cache write that lives an hour at
// twice the input price, one that lives five minutes at 1.25 times; CacheWrite counts both,
// CacheWrite1h the first. Billed all at the five-minute price, an agent that caches for an hour
// was charged 37.5 % less for its writes than the provider charged the operator.
func TestOneHourCacheWritesAtTheirOwnPrice(t *testing.T) {
	// Claude Sonnet: 3.00 input, 0.30 cache read, 3.75 five-minute and 6.00 one-hour writes, 15.00 output.
	p := Price{Input: 3_000_000, CacheRead: 300_000, CacheWrite: 3_750_000, CacheWrite1h: 6_000_000, Output: 15_000_000}
	for _, tc := range []struct {
		name string
		u    Usage
		want int64
	}{
		// 1000 five-minute writes = 3750 µUSD.
		{"five-minute writes", Usage{CacheWrite: 1000}, 3750},
		// 1000 one-hour writes = 6000 µUSD.
		{"one-hour writes", Usage{CacheWrite: 1000, CacheWrite1h: 1000}, 6000},
		// 600 at 3.75 + 400 at 6.00 = 2250 + 2400.
		{"both", Usage{CacheWrite: 1000, CacheWrite1h: 400}, 4650},
		// A part larger than its whole: billed for the larger (1000 one-hour writes).
		{"part over whole", Usage{CacheWrite: 10, CacheWrite1h: 1000}, 6000},
		{"negative part clamped", Usage{CacheWrite: 1000, CacheWrite1h: -5}, 3750},
	} {
		if got := p.Cost(tc.u); got != tc.want {
			t.Errorf("%s: Cost(%+v) = %d, want %d", tc.name, tc.u, got, tc.want)
		}
	}
	// Without a one-hour price (requests asking for it are refused at the door), any reported
	// anyway are billed at the five-minute price rather than at nothing.
	p.CacheWrite1h = 0
	if got := p.Cost(Usage{CacheWrite: 1000, CacheWrite1h: 400}); got != 3750 {
		t.Errorf("one-hour writes without their price: %d, want 3750", got)
	}
}

// TestAudioInputAtItsOwnPrice: OpenAI bills audio input tokens at many times the text rate
// (gpt-4o-audio-preview: 40.00 against 2.50 USD/M); Input counts them with the text, AudioInput
// the audio part. Billed at the text price, an audio prompt cost the operator 16 times what the
// caller paid for it.
func TestAudioInputAtItsOwnPrice(t *testing.T) {
	p := Price{Input: 2_500_000, CacheRead: 1_250_000, AudioInput: 40_000_000, Output: 10_000_000}
	for _, tc := range []struct {
		name string
		u    Usage
		want int64
	}{
		{"text", Usage{Input: 1000}, 2500},
		// 400 text at 2.50 + 600 audio at 40.00 = 1000 + 24000.
		{"text and audio", Usage{Input: 1000, AudioInput: 600}, 25_000},
		{"audio with output", Usage{Input: 600, AudioInput: 600, Output: 100}, 24_000 + 1000},
		// A part larger than its whole: billed for the larger (1000 audio tokens).
		{"part over whole", Usage{Input: 10, AudioInput: 1000}, 40_000},
		{"negative part clamped", Usage{Input: 1000, AudioInput: -5}, 2500},
	} {
		if got := p.Cost(tc.u); got != tc.want {
			t.Errorf("%s: Cost(%+v) = %d, want %d", tc.name, tc.u, got, tc.want)
		}
	}
	// The output bound before forwarding prices the prompt's audio too: 600 audio tokens leave
	// (30 000 - 24 000) / 10 per token = 600 output tokens of a 30 000 µUSD budget, not 2850.
	if got := p.MaxOutputWithin(Usage{Input: 600, AudioInput: 600}, 30_000); got != 600 {
		t.Errorf("MaxOutputWithin with 600 audio tokens = %d, want 600", got)
	}
	if got := p.WorstCase(Usage{Input: 600, AudioInput: 600}, 600); got != 30_000 {
		t.Errorf("WorstCase with 600 audio tokens = %d, want 30000", got)
	}
	// Without an audio price (requests with audio parts are refused at the door), any reported
	// anyway are billed at the input price rather than at nothing.
	p.AudioInput = 0
	if got := p.Cost(Usage{Input: 1000, AudioInput: 600}); got != 2500 {
		t.Errorf("audio without its price: %d, want 2500", got)
	}
}

func TestAudioOutputAtItsOwnPrice(t *testing.T) {
	p := Price{Input: 2_500_000, Output: 10_000_000, AudioOutput: 80_000_000}
	for _, tc := range []struct {
		name string
		u    Usage
		want int64
	}{
		{"text answer", Usage{Output: 1000}, 10_000},
		// 50 transcript tokens at 10.00 + 250 audio at 80.00 = 500 + 20 000.
		{"spoken answer", Usage{Output: 300, AudioOutput: 250}, 20_500},
		{"part over whole", Usage{Output: 10, AudioOutput: 100}, 8_000},
		{"negative part clamped", Usage{Output: 1000, AudioOutput: -5}, 10_000},
	} {
		if got := p.Cost(tc.u); got != tc.want {
			t.Errorf("%s: Cost(%+v) = %d, want %d", tc.name, tc.u, got, tc.want)
		}
	}
	// A call asking for a spoken answer is bounded with every output token as audio.
	if got := p.Spoken().MaxOutputWithin(Usage{}, 80_000); got != 1000 {
		t.Errorf("Spoken().MaxOutputWithin(80 000) = %d, want 1000 (80 µUSD a token)", got)
	}
	if got := p.MaxOutputWithin(Usage{}, 80_000); got != 8000 {
		t.Errorf("MaxOutputWithin(80 000) = %d, want 8000 (10 µUSD a text token)", got)
	}
	// Audio output priced below text (no provider does this): the bound keeps the text price.
	if got := (Price{Output: 10_000_000, AudioOutput: 1_000_000}).Spoken().Output; got != 10_000_000 {
		t.Errorf("Spoken output price %d, want the dearer 10 000 000", got)
	}
	// Without an audio output price (spoken answers are refused at the door), any reported
	// anyway are billed at the output price.
	p.AudioOutput = 0
	if got := p.Cost(Usage{Output: 300, AudioOutput: 250}); got != 3000 {
		t.Errorf("audio output without its price: %d, want 3000", got)
	}
}

func TestCostDoesNotOverflowAtTheBounds(t *testing.T) {
	p := Price{Input: maxPriceMicroPerM, CacheRead: maxPriceMicroPerM, CacheWrite: maxPriceMicroPerM, Output: maxPriceMicroPerM}
	u := Usage{Input: 1_000_000, Output: 1_000_000}
	// 2e6 tokens × 1e12 µUSD/M / 1e6 = 2e12 µUSD.
	if got := p.Cost(u); got != 2_000_000_000_000 {
		t.Fatalf("Cost = %d", got)
	}
}

func TestMaxOutputWithin(t *testing.T) {
	p := Price{Input: 2_500_000, Output: 10_000_000}
	// 100 input tokens = 250 µUSD; budget 1000 leaves 750 µUSD = 75 output tokens exactly.
	if got := p.MaxOutputWithin(Usage{Input: 100}, 1000); got != 75 {
		t.Fatalf("MaxOutputWithin(100, 1000) = %d, want 75", got)
	}
	// 76 output tokens would cost 1010.
	if c := p.WorstCase(Usage{Input: 100}, 76); c <= 1000 {
		t.Fatalf("WorstCase(100, 76) = %d", c)
	}
	if got := p.MaxOutputWithin(Usage{Input: 1000}, 1000); got != -1 {
		t.Fatalf("prompt alone over budget: got %d, want -1", got)
	}
}

func TestApplyDiscount(t *testing.T) {
	for _, tc := range []struct {
		cost int64
		bp   int
		want int64
	}{{1000, 0, 1000}, {1000, 2500, 750}, {1001, 2500, 751}, {3, 5000, 2}, {1000, 10000, 0}} {
		if got := ApplyDiscount(tc.cost, tc.bp); got != tc.want {
			t.Errorf("ApplyDiscount(%d, %d) = %d, want %d", tc.cost, tc.bp, got, tc.want)
		}
	}
}

func TestMaxCostWithin(t *testing.T) {
	for _, tc := range []struct {
		charge int64
		bp     int
		want   int64
	}{
		{1000, 0, 1000},
		{750, 2500, 1000},       // 1000 at 25 % off is 750
		{751, 2500, 1001},       // ceil(1001·0.75) = 751, ceil(1002·0.75) = 752
		{2, 5000, 4},            // ceil(4·0.5) = 2, ceil(5·0.5) = 3
		{0, 5000, 0},            // ceil(1·0.5) = 1
		{7, 10_000, MaxCost},    // free: only MaxCost bounds it
		{MaxCost, 100, MaxCost}, // past the bound
		{-1, 0, -1},
	} {
		if got := MaxCostWithin(tc.charge, tc.bp); got != tc.want {
			t.Errorf("MaxCostWithin(%d, %d) = %d, want %d", tc.charge, tc.bp, got, tc.want)
		}
	}
	// The defining property, across discounts and charges: the result's charge fits, one more
	// micro-USD does not.
	for bp := 0; bp < 10_000; bp += 37 {
		for charge := int64(0); charge < 3000; charge += 13 {
			c := MaxCostWithin(charge, bp)
			if ApplyDiscount(c, bp) > charge || ApplyDiscount(c+1, bp) <= charge {
				t.Fatalf("MaxCostWithin(%d, %d) = %d: charges %d and %d for one more", charge, bp, c,
					ApplyDiscount(c, bp), ApplyDiscount(c+1, bp))
			}
		}
	}
}

// TestMaxCostWithinLargeCharges: the defining property holds for charges past MaxCost/10 000
// (4.6·10^14 micro-USD) too, which config allows a cap to be (up to 10^15): those were
// answered MaxCost, whose discounted charge is thousands of times the cap, so a call at such a
// cap was bounded by nothing.
func TestMaxCostWithinLargeCharges(t *testing.T) {
	for _, charge := range []int64{MaxCost/10_000 + 1, 596_564_340_377_077, 1_000_000_000_000_000, MaxCost / 3, MaxCost - 1} {
		for _, bp := range []int{1, 1374, 2500, 5000, 9999} {
			c := MaxCostWithin(charge, bp)
			if ApplyDiscount(c, bp) > charge {
				t.Errorf("MaxCostWithin(%d, %d) = %d, which charges %d", charge, bp, c, ApplyDiscount(c, bp))
			}
			if c < MaxCost && ApplyDiscount(c+1, bp) <= charge {
				t.Errorf("MaxCostWithin(%d, %d) = %d, but one more charges %d, still within", charge, bp, c, ApplyDiscount(c+1, bp))
			}
		}
	}
}

func TestLookupExactThenLongestPrefix(t *testing.T) {
	tbl, err := NewTable(map[string]Price{"gpt-4o": {Input: 1}, "gpt-4o-mini": {Input: 2}, "gpt": {Input: 3}})
	if err != nil {
		t.Fatal(err)
	}
	for model, want := range map[string]int64{
		"gpt-4o": 1, "gpt-4o-2024-08-06": 1, "gpt-4o-mini": 2, "gpt-4o-mini-2024-07-18": 2, "gpt-3.5-turbo": 3,
	} {
		p, _, err := tbl.Lookup(model)
		if err != nil || p.Input != want {
			t.Errorf("Lookup(%q) = %+v, %v; want input %d", model, p, err, want)
		}
	}
	if _, _, err := tbl.Lookup("claude-3"); !errors.Is(err, ErrNotPriced) {
		t.Fatalf("unpriced model: %v", err)
	}
}

func BenchmarkCost(b *testing.B) {
	p := Price{Input: 2_500_000, CacheRead: 1_250_000, CacheWrite: 3_125_000, Output: 10_000_000}
	u := Usage{Input: 1234, CacheRead: 5678, CacheWrite: 90, Output: 4321}
	for b.Loop() {
		_ = p.Cost(u)
	}
}

// A cost past MaxInt64/10 000 (two corrupt usage reports of MaxTokens tallied in one run, or
// one at a price over ~$840/M) must not overflow: settlement charges
// min(ApplyDiscount(cost), cap), so a wrapped negative result would credit the user.
func TestApplyDiscountDoesNotOverflow(t *testing.T) {
	p := Price{Input: 600_000_000, Output: 600_000_000} // $600/M
	for _, cost := range []int64{p.Cost(Usage{Input: MaxTokens, Output: MaxTokens}), MaxCost, 922_337_203_685_478} {
		for _, bp := range []int{1, 1000, 5000, 9999} {
			keep := big.NewInt(int64(10_000 - bp))
			w := new(big.Int).Mul(big.NewInt(cost), keep)
			w.Add(w, big.NewInt(9_999)).Quo(w, big.NewInt(10_000))
			if got := ApplyDiscount(cost, bp); got != w.Int64() {
				t.Errorf("ApplyDiscount(%d, %d) = %d, want %d", cost, bp, got, w.Int64())
			}
		}
	}
}

// TestDearestBoundsPartsBilledAtTheirWhole: a price without its own part price bills the part
// at its whole's price, so the dearest of two prices bounds that part by it too: a fallback
// without an audio input price bills audio at its input price, dearer than the other's audio
// price here.
func TestDearestBoundsPartsBilledAtTheirWhole(t *testing.T) {
	asked := Price{Input: 2_500_000, CacheWrite: 3_000_000, CacheWrite1h: 4_000_000, Output: 10_000_000,
		AudioInput: 40_000_000, AudioOutput: 80_000_000}
	fallback := Price{Input: 100_000_000, CacheWrite: 9_000_000, Output: 200_000_000}
	u := Usage{Input: 1000, AudioInput: 1000, CacheWrite: 1000, CacheWrite1h: 1000, Output: 1000, AudioOutput: 1000}
	d := asked.Dearest(fallback)
	for _, p := range []Price{asked, fallback} {
		if d.Cost(u) < p.Cost(u) {
			t.Fatalf("dearest %+v costs %d, less than %d at %+v", d, d.Cost(u), p.Cost(u), p)
		}
	}
	if got := (Price{Input: 1, Output: 2}).Dearest(Price{Input: 3, Output: 1}); got != (Price{Input: 3, Output: 2}) {
		t.Fatalf("dearest of two prices without parts %+v: a part unpriced by both stays unpriced", got)
	}
}

// TestPromptWrittenKeepsAudioAtItsPrice: the bound for a prompt the provider may write to its
// cache raises the text input to the cache-write price, not the audio part: audio without a
// price of its own stays at the input price Cost bills it at, not at the raised one (which
// would lower an audio call's output bound, or refuse it, for a cost it cannot run up).
func TestPromptWrittenKeepsAudioAtItsPrice(t *testing.T) {
	p := Price{Input: 2_000_000, CacheWrite: 5_000_000, CacheWrite1h: 8_000_000, Output: 10_000_000}
	u := Usage{Input: 1_000_000, AudioInput: 400_000}
	for _, long := range []bool{false, true} {
		write := p.CacheWrite
		if long {
			write = p.CacheWrite1h
		}
		want := (600_000*write + 400_000*p.Input) / 1_000_000
		if got := p.PromptWritten(long).Cost(u); got != want {
			t.Errorf("long=%v: bound %d, want %d (text at the write price, audio at the input price)", long, got, want)
		}
	}
}

// TestLongContextPriceBillsTheWholeCall: Gemini 2.5 Pro bills a call whose prompt passes
// 200 000 tokens at its long-context rates — every token of it, output too — and one at the
// line at the short rates; the prompt counts cached and cache-written tokens. Billed at the
// short rates, a 300 k-token prompt cost the operator twice what the caller was charged.
func TestLongContextPriceBillsTheWholeCall(t *testing.T) {
	// 1.25 / 0.31 / 10.00 USD per million up to 200 k prompt tokens; 2.50 / 0.625 / 15.00 past it.
	long := Price{Input: 2_500_000, CacheRead: 625_000, CacheWrite: 2_500_000, Output: 15_000_000}
	p := Price{Input: 1_250_000, CacheRead: 310_000, CacheWrite: 1_250_000, Output: 10_000_000, Long: &long, LongAbove: 200_000}
	for _, tc := range []struct {
		name string
		u    Usage
		want int64
	}{
		// 200 000 × 1.25 + 1 000 × 10 = 250 000 + 10 000.
		{"at the line", Usage{Input: 200_000, Output: 1_000}, 260_000},
		// 200 001 × 2.50 + 1 000 × 15 = 500 002.5 + 15 000 → 515 003.
		{"one past it", Usage{Input: 200_001, Output: 1_000}, 515_003},
		// 150 000 uncached + 60 000 read from the cache = 210 000: 375 000 + 37 500 + 15 000.
		{"cached tokens count", Usage{Input: 150_000, CacheRead: 60_000, Output: 1_000}, 427_500},
		// 150 000 + 60 000 written: 375 000 + 150 000.
		{"cache writes count", Usage{Input: 150_000, CacheWrite: 60_000}, 525_000},
		// Output never moves a call past the line: 1 000 000 × 10 + 1 000 × 1.25.
		{"output does not count", Usage{Input: 1_000, Output: 1_000_000}, 10_001_250},
	} {
		if got := p.Cost(tc.u); got != tc.want {
			t.Errorf("%s: Cost(%+v) = %d, want %d", tc.name, tc.u, got, tc.want)
		}
	}
	// The output bound of a long prompt is reckoned at the long output price: 1 000 000 µUSD
	// less 300 000 × 2.50 leaves 250 000, 16 666 output tokens at 15.00.
	if got := p.MaxOutputWithin(Usage{Input: 300_000}, 1_000_000); got != 16_666 {
		t.Errorf("MaxOutputWithin of a long prompt = %d, want 16666", got)
	}
}

// TestLongContextPriceNeedsItsLine: a long-context price is refused without its line (or a
// line without a price, or a price with a long price of its own), so no table holds a tier
// that can never apply or always does by mistake.
func TestLongContextPriceNeedsItsLine(t *testing.T) {
	long := Price{Input: 2, Output: 2}
	for name, p := range map[string]Price{
		"price without line": {Input: 1, Output: 1, Long: &long},
		"line without price": {Input: 1, Output: 1, LongAbove: 200_000},
		"negative line":      {Input: 1, Output: 1, Long: &long, LongAbove: -1},
		"nested":             {Input: 1, Output: 1, Long: &Price{Input: 2, Long: &long, LongAbove: 5}, LongAbove: 10},
		"negative long rate": {Input: 1, Output: 1, Long: &Price{Input: -2}, LongAbove: 10},
	} {
		if _, err := NewTable(map[string]Price{"m": p}); err == nil {
			t.Errorf("%s: NewTable accepted %+v", name, p)
		}
	}
	if _, err := NewTable(map[string]Price{"m": {Input: 1, Output: 1, Long: &long, LongAbove: 200_000}}); err != nil {
		t.Errorf("a long-context price with its line refused: %v", err)
	}
}

// TestSnapshotKeepsTheLongContextPrice: a settlement's price snapshot explains its bill after
// the table changes; a long call's was billed at the long-context price, so the snapshot
// carries it and its line (and a model without one carries no such key).
func TestSnapshotKeepsTheLongContextPrice(t *testing.T) {
	long := Price{Input: 2_500_000, CacheRead: 625_000, CacheWrite: 2_500_000, Output: 15_000_000}
	p := Price{Input: 1_250_000, CacheRead: 310_000, CacheWrite: 1_250_000, Output: 10_000_000, Long: &long, LongAbove: 200_000}
	const want = `"long_context":{"above_prompt_tokens":200000,"audio_input":0,"audio_output":0,"cache_read":625000,"cache_write":2500000,"cache_write_1h":0,"input":2500000,"output":15000000}`
	if got := string(p.Snapshot("gemini-2.5-pro")); !strings.Contains(got, want) {
		t.Errorf("snapshot %s, want it to hold %s", got, want)
	}
	p.Long, p.LongAbove = nil, 0
	if got := string(p.Snapshot("gpt-4o")); strings.Contains(got, "long_context") {
		t.Errorf("snapshot of a price without a long-context price %s", got)
	}
}
