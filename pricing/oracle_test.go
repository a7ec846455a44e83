package pricing_test

// An independent billing oracle: the charge of a call worked out from the money rules of
// DESIGN §2 and the README ("How a call is charged", "Wire formats") in math/big, with no
// bound to overflow and no rounding but the ones the rules ask for, compared with the code's
// figure over many random usages, prices and discounts. The oracle prices straight from the
// written rules:
//
//   - prices are µUSD per million tokens of input, cache read, cache write and output, and of
//     the optional parts: one-hour cache writes (part of cache write), audio input (part of
//     input), audio output (part of output); a part whose own price is not configured is
//     billed at its whole's price; a part reported larger than its whole bills the whole as
//     the part (at worst more than the provider charged, never less);
//   - a model with a long-context price bills every token of a call whose prompt (input,
//     cache reads and cache writes) passes its line at that price instead;
//   - cost = ceil(Σ tokens × price / 10^6), one rounding per call;
//   - charge = ceil(cost × (10 000 − bp) / 10 000) (at least 0), clamped to the hold's cap;
//   - the charge is taken from what is left of the day's allowance first, then from prepaid.

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/pricing"
)

var (
	bigMillion = big.NewInt(1_000_000)
	bigTenK    = big.NewInt(10_000)
)

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b *big.Int) *big.Int {
	q, r := new(big.Int).QuoRem(a, b, new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// oracleCost is the cost of u at p in µUSD, exactly. Token counts are taken in the domain a
// Usage has (each field in [0, pricing.MaxTokens]: metering saturates what a provider reports).
func oracleCost(u pricing.Usage, p pricing.Price) *big.Int {
	tok := func(v int64) int64 { return max(0, min(v, pricing.MaxTokens)) }
	orDefault := func(part, whole int64) int64 {
		if part == 0 {
			return whole
		}
		return part
	}
	in, audioIn := tok(u.Input), tok(u.AudioInput)
	cw, hour := tok(u.CacheWrite), tok(u.CacheWrite1h)
	out, audioOut := tok(u.Output), tok(u.AudioOutput)
	in, cw, out = max(in, audioIn), max(cw, hour), max(out, audioOut)
	if p.Long != nil && in+tok(u.CacheRead)+cw > p.LongAbove {
		p = *p.Long // every token of a call whose prompt passes the line, at the long price
	}
	sum := new(big.Int)
	add := func(n, price int64) {
		sum.Add(sum, new(big.Int).Mul(big.NewInt(n), big.NewInt(price)))
	}
	add(in-audioIn, p.Input)
	add(audioIn, orDefault(p.AudioInput, p.Input))
	add(tok(u.CacheRead), p.CacheRead)
	add(cw-hour, p.CacheWrite)
	add(hour, orDefault(p.CacheWrite1h, p.CacheWrite))
	add(out-audioOut, p.Output)
	add(audioOut, orDefault(p.AudioOutput, p.Output))
	return ceilDiv(sum, bigMillion)
}

// oracleDiscount is what is charged for cost at bp basis points off, rounded up.
func oracleDiscount(cost *big.Int, bp int) *big.Int {
	bp = max(0, min(bp, 10_000))
	return ceilDiv(new(big.Int).Mul(cost, big.NewInt(int64(10_000-bp))), bigTenK)
}

// oracleCharge is the settled charge of a call of cost at bp off under a hold capped at capMicro.
func oracleCharge(cost *big.Int, bp int, capMicro int64) *big.Int {
	c := oracleDiscount(cost, bp)
	if c.Cmp(big.NewInt(capMicro)) > 0 {
		return big.NewInt(capMicro)
	}
	return c
}

// oracleSplit is the allowance and prepaid parts of charged, with usedToday already charged
// against the day's allowance.
func oracleSplit(charged, allowance, usedToday int64) (fromAllowance, fromPrepaid int64) {
	left := max(0, allowance-usedToday)
	fromAllowance = min(charged, left)
	return fromAllowance, charged - fromAllowance
}

// drawCount draws a token count that stresses the rules: zeros, small counts, counts at and
// around the saturation bound, and nonsense (negative, MaxInt64).
func drawCount(r *rand.Rand) int64 {
	switch r.IntN(10) {
	case 0:
		return 0
	case 1:
		return int64(r.IntN(5)) // 0..4: where rounding shows
	case 2:
		return r.Int64N(1_000_000)
	case 3:
		return pricing.MaxTokens - r.Int64N(3)
	case 4:
		return pricing.MaxTokens + r.Int64N(3)
	case 5:
		return []int64{math.MaxInt64, math.MinInt64, -1, -r.Int64N(1 << 50)}[r.IntN(4)]
	case 6:
		return r.Int64N(pricing.MaxTokens + 1)
	default:
		return r.Int64N(200_000)
	}
}

// drawPart draws a part of whole: none, some, all of it, more than it, or any count.
func drawPart(r *rand.Rand, whole int64) int64 {
	switch r.IntN(6) {
	case 0:
		return 0
	case 1:
		if whole > 0 {
			return r.Int64N(min(whole, math.MaxInt64-1) + 1)
		}
		return 0
	case 2:
		return whole
	case 3:
		if whole < math.MaxInt64-5 {
			return whole + 1 + r.Int64N(5)
		}
		return whole
	default:
		return drawCount(r)
	}
}

// maxPrice is the largest price config accepts (1 000 000 USD per million tokens).
const maxPrice = 1_000_000 * 1_000_000

func drawPrice(r *rand.Rand) int64 {
	switch r.IntN(7) {
	case 0:
		return 0
	case 1:
		return 1 + r.Int64N(3) // a millionth of a dollar per million: every call rounds
	case 2:
		return maxPrice - r.Int64N(2)
	case 3:
		return r.Int64N(maxPrice + 1)
	default:
		return r.Int64N(100_000_000) // up to 100 USD/M: real price lists
	}
}

func drawUsage(r *rand.Rand) pricing.Usage {
	u := pricing.Usage{Input: drawCount(r), CacheRead: drawCount(r), CacheWrite: drawCount(r), Output: drawCount(r)}
	u.AudioInput, u.CacheWrite1h, u.AudioOutput = drawPart(r, u.Input), drawPart(r, u.CacheWrite), drawPart(r, u.Output)
	return u
}

// drawPriceEntry draws a price, a third of them with a long-context price whose line a drawn
// usage's prompt falls on either side of.
func drawPriceEntry(r *rand.Rand) pricing.Price {
	p := drawRates(r)
	if r.IntN(3) == 0 {
		long := drawRates(r)
		p.Long, p.LongAbove = &long, max(1, min(drawCount(r), pricing.MaxTokens))
	}
	return p
}

func drawRates(r *rand.Rand) pricing.Price {
	return pricing.Price{Input: drawPrice(r), CacheRead: drawPrice(r), CacheWrite: drawPrice(r), Output: drawPrice(r),
		CacheWrite1h: drawPrice(r), AudioInput: drawPrice(r), AudioOutput: drawPrice(r)}
}

func drawBP(r *rand.Rand) int {
	switch r.IntN(6) {
	case 0:
		return 0
	case 1:
		return 10_000
	case 2:
		return []int{1, 9_999, 5_000, 3_333, -1, 10_001}[r.IntN(6)]
	default:
		return r.IntN(10_001)
	}
}

// TestOracleCost: the code's cost of a call is the oracle's for every drawn usage and price,
// including counts at and past the token bound, parts equal to and larger than their wholes,
// and prices at the configured maximum.
func TestOracleCost(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200_000 {
		u, p := drawUsage(r), drawPriceEntry(r)
		want := oracleCost(u, p)
		var got int64
		func() {
			defer func() {
				if e := recover(); e != nil {
					t.Fatalf("#%d Cost(%+v) at %+v panicked: %v (oracle %s)", i, u, p, e, want)
				}
			}()
			got = p.Cost(u)
		}()
		if !want.IsInt64() || want.Int64() != got {
			t.Fatalf("#%d Cost(%+v) at %+v = %d, oracle %s", i, u, p, got, want)
		}
	}
}

// TestOracleCostRoundsUpOnce: the cost is rounded up once per call, not per part: three
// parts of a third of a µUSD each cost 1 µUSD, not 3; and never less than the exact sum.
func TestOracleCostRoundsUpOnce(t *testing.T) {
	p := pricing.Price{Input: 1, CacheRead: 1, CacheWrite: 1, Output: 1, CacheWrite1h: 1, AudioInput: 1, AudioOutput: 1}
	u := pricing.Usage{Input: 333_334, CacheRead: 333_333, Output: 333_333}
	if got := p.Cost(u); got != 1 {
		t.Fatalf("cost %d, want 1: one rounding of 1 000 000 millionths", got)
	}
	if got := p.Cost(pricing.Usage{Input: 1}); got != 1 {
		t.Fatalf("cost of one token at a millionth of a µUSD %d, want 1 (rounded up, never to 0)", got)
	}
	if got := p.Cost(pricing.Usage{}); got != 0 {
		t.Fatalf("cost of nothing %d, want 0", got)
	}
}

// TestOracleDiscountAndCap: the charge of a cost at a discount, clamped to a cap, is the
// oracle's, for costs up to the cost bound and every discount (out-of-range ones included).
func TestOracleDiscountAndCap(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200_000 {
		var cost int64
		switch r.IntN(4) {
		case 0:
			cost = r.Int64N(10)
		case 1:
			cost = pricing.MaxCost - r.Int64N(3)
		case 2:
			cost = math.MaxInt64 - r.Int64N(3)
		default:
			cost = r.Int64N(1 << 40)
		}
		bp := drawBP(r)
		capMicro := []int64{0, 1, r.Int64N(1 << 50), pricing.MaxCost}[r.IntN(4)]
		if got, want := pricing.ApplyDiscount(cost, bp), oracleDiscount(big.NewInt(cost), bp); !want.IsInt64() || got != want.Int64() {
			t.Fatalf("#%d ApplyDiscount(%d, %d) = %d, oracle %s", i, cost, bp, got, want)
		}
		// The settlement's formula (holds: min(ApplyDiscount(cost, bp), cap)).
		got := min(pricing.ApplyDiscount(cost, bp), capMicro)
		if want := oracleCharge(big.NewInt(cost), bp, capMicro); got != want.Int64() {
			t.Fatalf("#%d charge of %d at %d bp under cap %d = %d, oracle %s", i, cost, bp, capMicro, got, want)
		}
	}
}

// TestOracleMaxCostWithin: MaxCostWithin(charge, bp) is the largest list cost (up to MaxCost,
// or the charge itself without a discount) whose discounted charge fits charge: the oracle's
// ⌊charge × 10 000 / (10 000 − bp)⌋.
func TestOracleMaxCostWithin(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 200_000 {
		charge := []int64{-1, 0, 1, r.Int64N(1 << 40), pricing.MaxCost, math.MaxInt64, r.Int64N(math.MaxInt64)}[r.IntN(7)]
		bp := drawBP(r)
		got := pricing.MaxCostWithin(charge, bp)
		var want *big.Int
		switch {
		case charge < 0:
			want = big.NewInt(-1)
		case bp >= 10_000:
			want = big.NewInt(pricing.MaxCost)
		case bp <= 0:
			want = big.NewInt(charge) // no discount: the charge is the cost
		default:
			keep := int64(10_000 - max(bp, 0))
			want = new(big.Int).Quo(new(big.Int).Mul(big.NewInt(charge), bigTenK), big.NewInt(keep))
			if want.Cmp(big.NewInt(pricing.MaxCost)) > 0 {
				want = big.NewInt(pricing.MaxCost)
			}
		}
		if got != want.Int64() {
			t.Fatalf("#%d MaxCostWithin(%d, %d) = %d, oracle %s", i, charge, bp, got, want)
		}
		if got >= 0 && oracleDiscount(big.NewInt(got), bp).Cmp(big.NewInt(charge)) > 0 {
			t.Fatalf("#%d MaxCostWithin(%d, %d) = %d charges %s, past the charge", i, charge, bp, got, oracleDiscount(big.NewInt(got), bp))
		}
	}
}

// TestOracleMaxOutputWithin: the output bound before forwarding is the largest output whose
// cost (the oracle's) fits the budget.
func TestOracleMaxOutputWithin(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 5_000 {
		p, prompt := drawPriceEntry(r), drawUsage(r)
		prompt.Output, prompt.AudioOutput = 0, 0
		budget := []int64{0, 1, r.Int64N(1 << 30), r.Int64N(pricing.MaxCost), pricing.MaxCost}[r.IntN(5)]
		got := p.MaxOutputWithin(prompt, budget)
		costAt := func(out int64) *big.Int { q := prompt; q.Output = out; return oracleCost(q, p) }
		b := big.NewInt(budget)
		if got < 0 {
			if costAt(0).Cmp(b) <= 0 {
				t.Fatalf("#%d MaxOutputWithin = -1, yet the prompt alone costs %s ≤ %d", i, costAt(0), budget)
			}
			continue
		}
		if costAt(got).Cmp(b) > 0 {
			t.Fatalf("#%d MaxOutputWithin = %d costs %s > budget %d", i, got, costAt(got), budget)
		}
		if got < pricing.MaxTokens && costAt(got+1).Cmp(b) <= 0 {
			t.Fatalf("#%d MaxOutputWithin = %d, yet %d output tokens cost %s ≤ budget %d", i, got, got+1, costAt(got+1), budget)
		}
	}
}

// TestOracleBoundingPrices: the prices that bound a call before it is made (a spoken answer,
// a prompt the provider may write to its cache, a router's fallback) never cost less than
// what the call can then be billed, by the oracle.
func TestOracleBoundingPrices(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for i := range 50_000 {
		p, o := drawPriceEntry(r), drawPriceEntry(r)
		n := r.Int64N(pricing.MaxTokens + 1)
		split := r.Int64N(n + 1)
		// Spoken: n output tokens, any of them audio.
		bound := p.Spoken().Cost(pricing.Usage{Output: n})
		if billed := oracleCost(pricing.Usage{Output: n, AudioOutput: split}, p); billed.Cmp(big.NewInt(bound)) > 0 {
			t.Fatalf("#%d spoken bound %d < billed %s (%d output, %d audio) at %+v", i, bound, billed, n, split, p)
		}
		// PromptWritten: n prompt tokens, split between input and (one-hour) cache writes.
		long := r.IntN(2) == 0
		bound = p.PromptWritten(long).Cost(pricing.Usage{Input: n})
		written := pricing.Usage{Input: n - split, CacheWrite: split}
		if long {
			written.CacheWrite1h = r.Int64N(split + 1)
		}
		if billed := oracleCost(written, p); billed.Cmp(big.NewInt(bound)) > 0 {
			t.Fatalf("#%d prompt-written bound %d < billed %s (%+v) at %+v", i, bound, billed, written, p)
		}
		// Dearest: any usage, at either price.
		u := drawUsage(r)
		bound = p.Dearest(o).Cost(u)
		for _, q := range []pricing.Price{p, o} {
			if billed := oracleCost(u, q); billed.Cmp(big.NewInt(bound)) > 0 {
				t.Fatalf("#%d fallback bound %d < billed %s (%+v) at %+v", i, bound, billed, u, q)
			}
		}
	}
}

// TestOracleLedgerSplit: what a settlement takes from the allowance and from prepaid credits
// sums to the charge, the allowance part never past what is left of the day's allowance.
func TestOracleLedgerSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for range 10_000 {
		charged, allowance, used := r.Int64N(1<<40), r.Int64N(1<<40), r.Int64N(1<<41)
		a, p := oracleSplit(charged, allowance, used)
		if a+p != charged || a < 0 || p < 0 || a > max(0, allowance-used) {
			t.Fatalf("split of %d (allowance %d, used %d): %d + %d", charged, allowance, used, a, p)
		}
	}
}

// decimalMicro is the oracle's reading of a price written in USD per million tokens: the
// decimal text, exactly, in µUSD per million; ok false when it is not a whole number of them.
func decimalMicro(s string) (*big.Int, bool) {
	q, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, false
	}
	q.Mul(q, new(big.Rat).SetInt(bigMillion))
	if !q.IsInt() {
		return nil, false
	}
	return q.Num(), true
}

// drawDecimal writes a price as an operator would: whole USD and up to six decimals.
func drawDecimal(r *rand.Rand) string {
	whole := []int64{0, 1, 3, r.Int64N(1000), 1_000_000}[r.IntN(5)]
	if whole == 1_000_000 {
		return "1000000"
	}
	decs := r.IntN(7)
	if decs == 0 {
		return fmt.Sprint(whole)
	}
	frac := make([]byte, decs)
	for i := range frac {
		frac[i] = byte('0' + r.IntN(10))
	}
	return fmt.Sprintf("%d.%s", whole, frac)
}

// TestOracleConfigToCredits: a price entry written in the configuration (decimal USD per
// million tokens), a plan's discount and a usage give the charge the oracle gives, and the
// charge shows as the exact decimal number of credits at credit_micro.
func TestOracleConfigToCredits(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	fields := []string{"input", "cache_read", "cache_write", "output", "cache_write_1h", "audio_input", "audio_output"}
	for i := range 3_000 {
		written := map[string]string{}
		var doc strings.Builder
		for _, f := range fields {
			if f != "input" && f != "output" && r.IntN(3) == 0 {
				continue // an optional price left out
			}
			written[f] = drawDecimal(r)
			fmt.Fprintf(&doc, "%s: %s\n", f, written[f])
		}
		var m config.ModelCfg
		if err := yaml.Unmarshal([]byte(doc.String()), &m); err != nil {
			t.Fatalf("#%d %s: %v", i, doc.String(), err)
		}
		cfg := config.Config{Models: map[string]config.ModelCfg{"m": m}}
		table, err := cfg.PriceTable()
		if err != nil {
			t.Fatalf("#%d %s: %v", i, doc.String(), err)
		}
		p, key, err := table.Lookup("m-2025-01-01")
		if err != nil || key != "m" {
			t.Fatalf("#%d lookup by prefix: %q %v", i, key, err)
		}
		// The oracle's price, from the text.
		var op pricing.Price
		for f, dst := range map[string]*int64{"input": &op.Input, "cache_read": &op.CacheRead, "cache_write": &op.CacheWrite,
			"output": &op.Output, "cache_write_1h": &op.CacheWrite1h, "audio_input": &op.AudioInput, "audio_output": &op.AudioOutput} {
			if s, ok := written[f]; ok {
				v, exact := decimalMicro(s)
				if !exact || !v.IsInt64() {
					t.Fatalf("#%d %s: %q not a whole number of µUSD/M", i, f, s)
				}
				*dst = v.Int64()
			}
		}
		if p != op {
			t.Fatalf("#%d config read %s as %+v, the text says %+v", i, doc.String(), p, op)
		}
		u := drawUsage(r)
		bp := r.IntN(10_001)
		creditMicro := []int64{1000, 1, 10, 1_000_000, 5_000_000, 1 << 10, 1_000_000_000_000}[r.IntN(7)]
		plan := config.Plan{MaxRunCostCredits: config.CreditsOf(500)}
		capMicro := plan.MaxRunCostCredits.MicroAt(creditMicro)
		if want := big.NewInt(500 * creditMicro); capMicro != want.Int64() {
			t.Fatalf("#%d 500 credits at %d µUSD each = %d µUSD, want %s", i, creditMicro, capMicro, want)
		}
		charged := min(pricing.ApplyDiscount(p.Cost(u), bp), capMicro)
		want := oracleCharge(oracleCost(u, op), bp, capMicro)
		if charged != want.Int64() {
			t.Fatalf("#%d charge %d, oracle %s (usage %+v, %s, %d bp)", i, charged, want, u, doc.String(), bp)
		}
		// Shown in credits: charged / credit_micro, exactly.
		shown := pricing.FormatCredits(charged, creditMicro)
		q, ok := new(big.Rat).SetString(shown)
		if !ok || q.Cmp(new(big.Rat).SetFrac(want, big.NewInt(creditMicro))) != 0 {
			t.Fatalf("#%d %d µUSD at %d µUSD/credit shown as %q", i, charged, creditMicro, shown)
		}
	}
}

// TestOracleWrittenPrices: a price written with more than six decimals (a fraction of a µUSD
// per million) is refused rather than rounded, and one past the configured maximum does not
// build a table.
func TestOracleWrittenPrices(t *testing.T) {
	var m config.ModelCfg
	if err := yaml.Unmarshal([]byte("input: 0.0000001\noutput: 1\n"), &m); err == nil {
		t.Fatalf("a price of 0.0000001 USD/M read as %d µUSD/M, not refused", m.Input.Micro)
	}
	if err := yaml.Unmarshal([]byte("input: -1\noutput: 1\n"), &m); err == nil {
		t.Fatalf("a negative price read as %d µUSD/M, not refused", m.Input.Micro)
	}
	if err := yaml.Unmarshal([]byte("input: 1000000.000001\noutput: 1\n"), &m); err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{Models: map[string]config.ModelCfg{"m": m}}
	if _, err := cfg.PriceTable(); err == nil {
		t.Fatal("a price past 1 000 000 USD/M built a table: its costs could overflow")
	}
}

// TestOracleCreditsShownExactly: any balance (a debt included) shows as exactly its number of
// credits at every credit_micro config accepts, and what is shown parses back to the same
// micro-USD (a grant typed from a statement credits what it says).
func TestOracleCreditsShownExactly(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for i := range 50_000 {
		creditMicro := []int64{1, 2, 5, 10, 1000, 1 << 10, 5_000_000, 1_000_000_000_000, 1 << 18, 9_765_625}[r.IntN(10)]
		micro := []int64{0, 1, -1, r.Int64N(1 << 50), -r.Int64N(1 << 50), math.MaxInt64, math.MinInt64}[r.IntN(7)]
		shown := pricing.FormatCredits(micro, creditMicro)
		q, ok := new(big.Rat).SetString(shown)
		if !ok || q.Cmp(big.NewRat(micro, creditMicro)) != 0 {
			t.Fatalf("#%d %d µUSD at %d µUSD/credit shown as %q", i, micro, creditMicro, shown)
		}
		if micro == math.MinInt64 {
			continue // its magnitude is no int64: ParseCredits reads the magnitude first
		}
		if back, err := pricing.ParseCredits(shown, creditMicro); err == nil && back != micro {
			t.Fatalf("#%d %q parsed back as %d µUSD, shown from %d", i, shown, back, micro)
		} else if err != nil && new(big.Rat).Abs(q).Cmp(big.NewRat(1_000_000_000_000, 1)) < 0 {
			t.Fatalf("#%d %q (%d µUSD at %d) refused: %v", i, shown, micro, creditMicro, err)
		}
	}
}

// TestOracleDearestAcrossLongContextLines: a router's list of several models (the asked one
// and its fallbacks, pricing.Price.Dearest of all of them, made Spoken or PromptWritten as the
// call asks) bounds what any of them may bill, where their long-context lines differ, some
// have none, and the prompt falls between the lines, on one or at either side: the bound's
// cost of any usage, and the output bound within a budget at it, never bill more at any of
// them. TestOracleBoundingPrices draws lines at random, so a prompt rarely falls between two.
func TestOracleDearestAcrossLongContextLines(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for i := range 50_000 {
		u := pricing.Usage{Input: r.Int64N(400_000), CacheRead: r.Int64N(100_000), CacheWrite: r.Int64N(100_000)}
		u.AudioInput, u.CacheWrite1h = r.Int64N(u.Input+1), r.Int64N(u.CacheWrite+1)
		prompt := u.Input + u.CacheRead + u.CacheWrite
		models := make([]pricing.Price, 1+r.IntN(3))
		for j := range models {
			p := drawRates(r)
			if r.IntN(4) != 0 {
				long := drawRates(r)
				p.Long, p.LongAbove = &long, max(1, prompt+r.Int64N(5)-2) // at, just under or just past the prompt
				if r.IntN(3) == 0 {
					p.LongAbove = 1 + r.Int64N(600_000)
				}
			}
			models[j] = p
		}
		bound := models[0]
		for _, p := range models[1:] {
			bound = bound.Dearest(p)
		}
		spoken, written, hour := r.IntN(2) == 0, r.IntN(2) == 0, r.IntN(2) == 0
		if spoken {
			bound = bound.Spoken()
		}
		if written {
			bound = bound.PromptWritten(hour)
		}
		// What the bound reckons: the prompt as input (written to the cache, when marked), any
		// output as text.
		asked := pricing.Usage{Input: prompt, AudioInput: u.AudioInput}
		budget := r.Int64N(1 << 32)
		limit := bound.MaxOutputWithin(asked, budget)
		for _, out := range []int64{0, 1 + r.Int64N(100_000), limit} {
			if out < 0 {
				continue
			}
			asked.Output = out
			billed := u
			if !written {
				// Unmarked, the provider writes nothing to its cache: the prompt is input and
				// cache reads.
				billed.Input, billed.CacheWrite, billed.CacheWrite1h = u.Input+u.CacheWrite, 0, 0
			} else if !hour {
				billed.CacheWrite1h = 0
			}
			billed.Output = out
			if spoken {
				billed.AudioOutput = r.Int64N(out + 1)
			}
			b := bound.Cost(asked)
			for j, p := range models {
				got := oracleCost(billed, p)
				// Cache reads are no dearer than input on a real price list; a drawn one may be.
				if p.CacheRead > p.Input || (p.Long != nil && p.Long.CacheRead > p.Long.Input) {
					continue
				}
				if got.Cmp(big.NewInt(b)) > 0 {
					t.Fatalf("#%d bound %d < billed %s by model %d %+v (long %+v) for %+v; bound reckoned %+v at %+v (long %+v)",
						i, b, got, j, p, p.Long, billed, asked, bound, bound.Long)
				}
				if out == limit && got.Cmp(big.NewInt(budget)) > 0 {
					t.Fatalf("#%d output bound %d within %d bills %s at model %d", i, limit, budget, got, j)
				}
			}
		}
	}
}
