// Package pricing turns token usage into money. It is pure: no I/O, no clocks, no floats.
//
// Money is int64 micro-USD. Prices are kept as micro-USD per million tokens, so a price of
// 2.50 USD/M is 2_500_000 and the cost of n tokens is n*price/1e6 micro-USD, exact until the
// single rounding up at the end of a call.
package pricing

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
)

// MaxTokens bounds each token field of a Usage. Providers report far less; anything larger is
// a corrupt usage object, and the bound keeps every product below far from 128-bit overflow.
const MaxTokens = 1 << 40

// MaxCost bounds every cost and budget: Cost panics past it, so nothing that fits in a cap can
// overflow.
const MaxCost = 1 << 62

// maxPriceMicroPerM bounds a configured price (1,000,000 USD per million tokens).
const maxPriceMicroPerM = 1_000_000 * 1_000_000

// Cost's one rounding needs Σ tokens × price to stay within MaxCost millionths: Clamp leaves at
// most four wholes of MaxTokens tokens, each at most maxPriceMicroPerM. The build fails here
// (a negative uint64 constant) if a bound is raised past that.
const _ uint64 = MaxCost - 4*MaxTokens*(maxPriceMicroPerM/1_000_000)

// Usage is what one call used, normalised across wire formats. Input excludes cached and
// cache-write tokens: each field is billed at its own price.
type Usage struct {
	Input      int64 `json:"input"`
	CacheRead  int64 `json:"cache_read"`
	CacheWrite int64 `json:"cache_write"`
	Output     int64 `json:"output"`
	// CacheWrite1h is the part of CacheWrite written to a one-hour cache (Anthropic's
	// cache_control ttl "1h"), which the provider bills at a higher rate than the five-minute
	// writes. CacheWrite is the total; the part is stored beside it (cache_write_1h_tok), as
	// the provider's invoice lists it on a line of its own.
	CacheWrite1h int64 `json:"cache_write_1h,omitempty"`
	// AudioInput is the part of Input that was audio (OpenAI's input_audio parts), which the
	// provider bills at several times the text rate. Input is the total; the part is stored
	// beside it (audio_in_tok).
	AudioInput int64 `json:"audio_input,omitempty"`
	// AudioOutput is the part of Output that was audio (a chat answer asked for with
	// modalities ["text", "audio"]), billed at a higher rate than text again. Output is the
	// total; the part is stored beside it (audio_out_tok).
	AudioOutput int64 `json:"audio_output,omitempty"`
}

// RunCounts is a run's usage as the run views show it — the operator's, the CLI's and the
// caller's own: u's token counts under their JSON names and the calls they came in, its parts
// (one-hour cache writes, audio in and out) included at 0 for a run settled before they were
// stored, so that a billing team's import finds each key on every run.
func (u Usage) RunCounts(calls int64) map[string]int64 {
	return map[string]int64{"input": u.Input, "cache_read": u.CacheRead, "cache_write": u.CacheWrite, "output": u.Output,
		"cache_write_1h": u.CacheWrite1h, "audio_input": u.AudioInput, "audio_output": u.AudioOutput, "calls": calls}
}

// HasNegative reports whether any count of u is below zero: no call uses negative tokens, so
// such a usage (a tally holding a correction alone, a hand edit) is no record of what was used.
// It sits beside the struct so that a field added to it is added here too
// (TestUsageHasNegativeSeesEveryField fails otherwise).
func (u Usage) HasNegative() bool {
	return u.Input < 0 || u.CacheRead < 0 || u.CacheWrite < 0 || u.Output < 0 ||
		u.CacheWrite1h < 0 || u.AudioInput < 0 || u.AudioOutput < 0
}

// Add returns the field-wise sum.
func (u Usage) Add(o Usage) Usage {
	return Usage{Input: u.Input + o.Input, CacheRead: u.CacheRead + o.CacheRead, CacheWrite: u.CacheWrite + o.CacheWrite,
		Output: u.Output + o.Output, CacheWrite1h: u.CacheWrite1h + o.CacheWrite1h, AudioInput: u.AudioInput + o.AudioInput,
		AudioOutput: u.AudioOutput + o.AudioOutput}
}

// Sub returns the field-wise difference u - o.
func (u Usage) Sub(o Usage) Usage {
	return Usage{Input: u.Input - o.Input, CacheRead: u.CacheRead - o.CacheRead, CacheWrite: u.CacheWrite - o.CacheWrite,
		Output: u.Output - o.Output, CacheWrite1h: u.CacheWrite1h - o.CacheWrite1h, AudioInput: u.AudioInput - o.AudioInput,
		AudioOutput: u.AudioOutput - o.AudioOutput}
}

// Clamp returns u with every field inside [0, MaxTokens], CacheWrite at least CacheWrite1h,
// Input at least AudioInput and Output at least AudioOutput (a report whose part is larger
// than its whole is billed for the larger).
func (u Usage) Clamp() Usage {
	c := func(v int64) int64 { return max(0, min(v, MaxTokens)) }
	hour, audioIn, audioOut := c(u.CacheWrite1h), c(u.AudioInput), c(u.AudioOutput)
	return Usage{Input: max(c(u.Input), audioIn), CacheRead: c(u.CacheRead), CacheWrite: max(c(u.CacheWrite), hour),
		Output: max(c(u.Output), audioOut), CacheWrite1h: hour, AudioInput: audioIn, AudioOutput: audioOut}
}

// prompt is how many tokens u's prompt held, cached and written to the cache included: what
// the providers compare with their long-context line.
func (u Usage) prompt() int64 {
	u = u.Clamp()
	return u.Input + u.CacheRead + u.CacheWrite
}

// Price is one model's price in micro-USD per million tokens.
type Price struct {
	Input      int64 `json:"input"`
	CacheRead  int64 `json:"cache_read"`
	CacheWrite int64 `json:"cache_write"`
	Output     int64 `json:"output"`
	// CacheWrite1h prices one-hour cache writes; 0 when not configured: a request asking for
	// them is then refused (proxy: unpriced_option), and any reported anyway are billed at
	// CacheWrite.
	CacheWrite1h int64 `json:"cache_write_1h"`
	// AudioInput prices audio input tokens; 0 when not configured: a request with audio parts
	// is then refused (proxy: unpriced_option), and any reported anyway are billed at Input.
	AudioInput int64 `json:"audio_input"`
	// AudioOutput prices audio output tokens; 0 when not configured: a request asking for an
	// audio answer is then refused (proxy: unpriced_option), and any reported anyway are
	// billed at Output.
	AudioOutput int64 `json:"audio_output"`
	// Long is the price of every token of a call whose prompt passes LongAbove tokens, when
	// the provider has one (Gemini 2.5 Pro past 200 k, Claude's 1M-context beta past 200 k):
	// such a call is billed at it as a whole, output included, not only the tokens past the
	// line. nil when the model has one price at every length. A Long has no Long of its own.
	Long *Price `json:"long,omitempty"`
	// LongAbove is the prompt size (input, cache reads and cache writes) past which Long
	// applies; 0 with Long nil.
	LongAbove int64 `json:"long_above,omitempty"`
}

// Cost is ceil(Σ tokens × price / 1e6) micro-USD: one rounding per call, always up, so the
// gateway never bills less than the provider charged it.
func (p Price) Cost(u Usage) int64 {
	u = u.Clamp()
	p = p.For(u)
	hourPrice, audioInPrice, audioOutPrice := p.CacheWrite1h, p.AudioInput, p.AudioOutput
	if hourPrice == 0 {
		hourPrice = p.CacheWrite
	}
	if audioInPrice == 0 {
		audioInPrice = p.Input
	}
	if audioOutPrice == 0 {
		audioOutPrice = p.Output
	}
	// Each part is billed apart from its whole, so the tokens still sum to at most the four
	// wholes: the bound on Σ tokens × price below holds.
	var hi, lo uint64
	for _, term := range [7][2]int64{{u.Input - u.AudioInput, p.Input}, {u.AudioInput, audioInPrice}, {u.CacheRead, p.CacheRead},
		{u.CacheWrite - u.CacheWrite1h, p.CacheWrite}, {u.CacheWrite1h, hourPrice},
		{u.Output - u.AudioOutput, p.Output}, {u.AudioOutput, audioOutPrice}} {
		h, l := bits.Mul64(uint64(term[0]), uint64(term[1]))
		var carry uint64
		lo, carry = bits.Add64(lo, l, 0)
		hi += h + carry
	}
	const million = 1_000_000
	if hi >= million { // quotient would not fit 64 bits; unreachable with the bounds above
		panic("pricing: cost overflow")
	}
	q, r := bits.Div64(hi, lo, million)
	if r != 0 {
		q++
	}
	if q > MaxCost {
		panic("pricing: cost overflow")
	}
	return int64(q)
}

// For is the price u is billed at: Long when u's prompt passes LongAbove, else p. The tier
// depends on the prompt alone, so a call's output never moves it (MaxOutputWithin relies on
// that), and the result has no Long.
func (p Price) For(u Usage) Price {
	long := p.Long
	if long != nil && u.prompt() > p.LongAbove {
		return *long
	}
	p.Long, p.LongAbove = nil, 0
	return p
}

// WorstCase is the cost of a call whose prompt is prompt and that produces maxOutput tokens:
// the figure compared against a cap before forwarding.
func (p Price) WorstCase(prompt Usage, maxOutput int64) int64 {
	prompt.Output = maxOutput
	return p.Cost(prompt)
}

// MaxOutputWithin returns the largest output token count whose worst case, after prompt,
// costs at most budget micro-USD. It returns -1 when even zero output is over budget.
func (p Price) MaxOutputWithin(prompt Usage, budget int64) int64 {
	prompt.Output = 0
	p = p.For(prompt)
	base := p.Cost(prompt)
	if base > budget {
		return -1
	}
	if p.Output == 0 {
		return MaxTokens
	}
	// Cost is monotone in output: binary search instead of dividing, so the rounding rule lives
	// in Cost alone.
	lo, hi := int64(0), int64(MaxTokens)
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		prompt.Output = mid
		if p.Cost(prompt) <= budget {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// Spoken is the price that bounds a call whose answer may be audio: every output token at the
// dearer of the text and audio output prices, since how much of the answer will be audio is
// not known before it is made.
func (p Price) Spoken() Price {
	p.Output = max(p.Output, p.AudioOutput)
	return p.withLong(Price.Spoken)
}

// PromptWritten is the price that bounds a call whose prompt the provider may write to its
// cache: every input token at the dearer of the input and the cache-write price (the one-hour
// one too when long). Audio input keeps its own price.
func (p Price) PromptWritten(long bool) Price {
	if p.AudioInput == 0 {
		p.AudioInput = p.Input // Cost bills audio at the input price when it has none of its own
	}
	p.Input = max(p.Input, p.CacheWrite)
	if long {
		p.Input = max(p.Input, p.CacheWrite1h)
	}
	return p.withLong(func(l Price) Price { return l.PromptWritten(long) })
}

// withLong returns p with f applied to its long-context price too, so that a bounding price
// bounds a long call as it bounds a short one. The Long is copied: prices are values, and the
// table's own must not change under a caller.
func (p Price) withLong(f func(Price) Price) Price {
	if p.Long != nil {
		l := f(*p.Long)
		p.Long = &l
	}
	return p
}

// Dearest is the price that bounds a call that may be billed at p or at o (a router's
// fallback answering instead of the model asked for): each field at the dearer of the two, so
// its cost of any usage is at least the cost at either. A part's price (one-hour writes, audio
// in and out) is compared as Cost bills it: one left unset bills the part at its whole's
// price, which may be dearer than the other's own part price (a model without an audio
// input price bills audio at its text price of 100 USD/M, past the 40 of the model asked).
func (p Price) Dearest(o Price) Price {
	d := p.dearestRates(o)
	if p.Long == nil && o.Long == nil {
		return d
	}
	// A prompt may pass one model's line and not the other's: past the lower line, either may
	// bill its long price or its short one, so the bound takes the dearest of all four.
	long := p.longOrSelf().dearestRates(o.longOrSelf()).dearestRates(d)
	d.Long, d.LongAbove = &long, min(p.longLine(), o.longLine())
	return d
}

// longOrSelf is the price p bills a long prompt at: its Long, or itself without one.
func (p Price) longOrSelf() Price {
	if p.Long != nil {
		return *p.Long
	}
	return p
}

// longLine is the prompt size past which p bills its Long: MaxTokens×3 (no prompt passes it:
// Clamp leaves each of its three counts at most MaxTokens) without one.
func (p Price) longLine() int64 {
	if p.Long == nil {
		return 3 * MaxTokens
	}
	return p.LongAbove
}

// dearestRates is Dearest of the rates alone, Long left out.
func (p Price) dearestRates(o Price) Price {
	part := func(pPart, pWhole, oPart, oWhole int64) int64 {
		if pPart == 0 && oPart == 0 {
			return 0 // both bill it at their whole: the dearer whole below does too
		}
		billed := func(part, whole int64) int64 {
			if part == 0 {
				return whole
			}
			return part
		}
		return max(billed(pPart, pWhole), billed(oPart, oWhole))
	}
	return Price{Input: max(p.Input, o.Input), CacheRead: max(p.CacheRead, o.CacheRead), CacheWrite: max(p.CacheWrite, o.CacheWrite),
		Output: max(p.Output, o.Output), CacheWrite1h: part(p.CacheWrite1h, p.CacheWrite, o.CacheWrite1h, o.CacheWrite),
		AudioInput: part(p.AudioInput, p.Input, o.AudioInput, o.Input), AudioOutput: part(p.AudioOutput, p.Output, o.AudioOutput, o.Output)}
}

// Snapshot is the record of p kept with each settlement of model, so that a bill can be
// explained after the price table changes.
func (p Price) Snapshot(model string) []byte {
	snap := map[string]any{"model": model, "unit": "micro_usd_per_million_tokens",
		"input": p.Input, "cache_read": p.CacheRead, "cache_write": p.CacheWrite, "cache_write_1h": p.CacheWrite1h,
		"output": p.Output, "audio_input": p.AudioInput, "audio_output": p.AudioOutput}
	if l := p.Long; l != nil {
		snap["long_context"] = map[string]any{"above_prompt_tokens": p.LongAbove,
			"input": l.Input, "cache_read": l.CacheRead, "cache_write": l.CacheWrite, "cache_write_1h": l.CacheWrite1h,
			"output": l.Output, "audio_input": l.AudioInput, "audio_output": l.AudioOutput}
	}
	b, err := json.Marshal(snap)
	if err != nil {
		panic("pricing: snapshot: " + err.Error()) // a map of strings and integers always encodes
	}
	return b
}

// validate reports a price that is negative or absurdly large, and a long-context price
// without its line, or with one of its own.
func (p Price) validate() error {
	if err := p.validateRates(); err != nil {
		return err
	}
	switch l := p.Long; {
	case l == nil && p.LongAbove != 0:
		return fmt.Errorf("a long-context line (%d prompt tokens) without a long-context price", p.LongAbove)
	case l == nil:
		return nil
	case p.LongAbove <= 0 || p.LongAbove > MaxTokens:
		return fmt.Errorf("long-context line %d prompt tokens outside [1, %d]", p.LongAbove, int64(MaxTokens))
	case l.Long != nil || l.LongAbove != 0:
		return errors.New("a long-context price with a long-context price of its own")
	}
	if err := p.Long.validateRates(); err != nil {
		return fmt.Errorf("long context: %w", err)
	}
	return nil
}

// validateRates reports a rate that is negative or absurdly large.
func (p Price) validateRates() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"input", p.Input}, {"cache_read", p.CacheRead}, {"cache_write", p.CacheWrite}, {"cache_write_1h", p.CacheWrite1h}, {"output", p.Output},
		{"audio_input", p.AudioInput}, {"audio_output", p.AudioOutput}} {
		if f.v < 0 || f.v > maxPriceMicroPerM {
			return fmt.Errorf("%s price %d micro-USD/M outside [0, %d]", f.name, f.v, int64(maxPriceMicroPerM))
		}
	}
	return nil
}

// ApplyDiscount returns what is charged for cost at a discount of bp basis points, rounded up
// (the discount never rounds in the caller's favour past the provider's cost share).
func ApplyDiscount(cost int64, bp int) int64 {
	if bp <= 0 {
		return cost
	}
	if bp >= 10_000 {
		return 0
	}
	keep := int64(10_000 - bp)
	// cost = a·10 000 + b, so cost·keep/10 000 = a·keep + b·keep/10 000: no product
	// overflows for any cost up to MaxInt64.
	a, b := cost/10_000, cost%10_000
	return a*keep + (b*keep+9_999)/10_000
}

// MaxCostWithin returns the largest cost whose charge at a discount of bp basis points is at
// most charge: a cap is a bound on what is charged, so a discounted caller's call may cost
// (at list price) more than the cap itself. A free caller (bp ≥ 10 000) is bounded by
// MaxCost alone.
func MaxCostWithin(charge int64, bp int) int64 {
	switch {
	case charge < 0:
		return -1
	case bp <= 0:
		return charge
	case bp >= 10_000:
		return MaxCost
	}
	// ApplyDiscount(c) = ceil(c·keep/10 000) ≤ charge  ⟺  c·keep/10 000 ≤ charge (charge is an
	// integer)  ⟺  c ≤ charge·10 000/keep. With charge = q·keep + r that is
	// q·10 000 + r·10 000/keep, no product of which overflows (r < keep ≤ 10 000); only a
	// quotient past MaxCost is MaxCost.
	keep := int64(10_000 - bp)
	q, r := charge/keep, charge%keep
	if q > MaxCost/10_000 {
		return MaxCost
	}
	return min(MaxCost, q*10_000+r*10_000/keep)
}
