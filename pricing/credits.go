package pricing

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// FormatCredits shows micro-USD as credits: an exact decimal ("3.412", "-0.5"), never a
// rounded float, because a balance an operator reconciles against a payment must not drift.
// Every credit_micro of the form 2^a·5^b (ExactCreditMicro) shows every amount exactly, with
// as many decimals as it takes (a credit of 5 000 000 micro-USD shows 1 micro-USD as
// "0.0000002"); for any other the sixth decimal is truncated, and config refuses it.
func FormatCredits(micro, creditMicro int64) string {
	if creditMicro <= 0 {
		panic("pricing: credit_micro must be positive")
	}
	neg := micro < 0
	// Work in uint64 so that math.MinInt64 has a magnitude.
	mag := uint64(micro)
	if neg {
		mag = -mag
	}
	cm := uint64(creditMicro)
	decimals, exact := creditDecimals(creditMicro)
	if !exact {
		decimals = 6
	}
	scale := uint64(1)
	for range decimals {
		scale *= 10
	}
	whole := mag / cm
	var frac uint64
	if exact {
		frac = (mag % cm) * (scale / cm) // < scale ≤ 10^18: no overflow
	} else {
		// millionths of a credit = (mag mod creditMicro) · 10^6 / creditMicro, in 128 bits: the
		// product passes 64 once creditMicro does 1.8·10^13. The quotient is below 10^6.
		hi, lo := bits.Mul64(mag%cm, 1_000_000)
		frac, _ = bits.Div64(hi, lo, cm)
	}
	out := strconv.FormatUint(whole, 10)
	if frac != 0 {
		f := strconv.FormatUint(frac+scale, 10)[1:]
		out += "." + strings.TrimRight(f, "0")
	}
	if neg && (whole != 0 || frac != 0) {
		out = "-" + out
	}
	return out
}

// ExactCreditMicro reports whether every amount of micro-USD shows as an exact decimal number
// of credits at creditMicro (creditMicro is 2^a·5^b, at most 10^18).
func ExactCreditMicro(creditMicro int64) bool {
	if creditMicro <= 0 {
		return false
	}
	_, ok := creditDecimals(creditMicro)
	return ok
}

// ErrBadCredits is an amount of credits that is not an exact decimal in range.
var ErrBadCredits = errors.New("bad credit amount")

// ParseCredits reads a decimal amount of credits ("12.5", "-3", "0.001") and returns it in
// micro-USD. It refuses, rather than rounds, an amount that is not a whole number of micro-USD
// at creditMicro: a grant must credit exactly what the operator typed.
func ParseCredits(s string, creditMicro int64) (int64, error) {
	if creditMicro <= 0 {
		panic("pricing: credit_micro must be positive")
	}
	orig := s
	s = strings.TrimSpace(s)
	neg := false
	switch {
	case strings.HasPrefix(s, "-"):
		neg, s = true, s[1:]
	case strings.HasPrefix(s, "+"):
		s = s[1:]
	}
	whole, frac, hasDot := strings.Cut(s, ".")
	if whole == "" && frac == "" {
		return 0, fmt.Errorf("%w: %q is not a number", ErrBadCredits, orig)
	}
	if !digits(whole) || !digits(frac) || (hasDot && frac == "") {
		return 0, fmt.Errorf("%w: %q is not a plain decimal", ErrBadCredits, orig)
	}
	frac = strings.TrimRight(frac, "0")
	// A credit worth more than a dollar (credit_micro 5 000 000) shows a micro-USD with more
	// than 6 decimals (FormatCredits): what it shows must parse back.
	maxDec := 6
	if d, ok := creditDecimals(creditMicro); ok && d > maxDec {
		maxDec = d
	}
	if len(frac) > maxDec {
		return 0, fmt.Errorf("%w: %q has more than %d decimals", ErrBadCredits, orig, maxDec)
	}
	whole = strings.TrimLeft(whole, "0")
	if len(whole) > 12 { // a trillion credits is past any real grant, and keeps the product in int64 range
		return 0, fmt.Errorf("%w: %q is too large", ErrBadCredits, orig)
	}
	var w int64
	if whole != "" {
		w, _ = strconv.ParseInt(whole, 10, 64)
	}
	if w > math.MaxInt64/creditMicro {
		return 0, fmt.Errorf("%w: %q is too large", ErrBadCredits, orig)
	}
	fracMicro, err := fracToMicro(frac, maxDec, creditMicro)
	if err != nil {
		return 0, fmt.Errorf("%w: %q %s", ErrBadCredits, orig, err)
	}
	micro := w*creditMicro + fracMicro
	if micro < 0 {
		return 0, fmt.Errorf("%w: %q is too large", ErrBadCredits, orig)
	}
	if neg {
		micro = -micro
	}
	return micro, nil
}

// creditDecimals returns the fewest decimals d with 10^d a multiple of creditMicro (at most
// 18), and whether there is one: then every micro-USD amount is an exact decimal of credits
// with d decimals.
func creditDecimals(creditMicro int64) (int, bool) {
	p := uint64(1)
	for d := 0; d <= 18; d++ {
		if p%uint64(creditMicro) == 0 {
			return d, true
		}
		p *= 10
	}
	return 0, false
}

// fracToMicro turns the decimals frac (at most maxDec digits, no trailing zeros) of a credit
// amount into micro-USD at creditMicro, refusing a fraction of a micro-USD. maxDec is 6, or
// more when creditMicro divides 10^maxDec (a credit worth more than a dollar).
func fracToMicro(frac string, maxDec int, creditMicro int64) (int64, error) {
	var f int64
	if maxDec > 6 {
		// creditMicro divides 10^maxDec: f units of 10^-maxDec credits are f/(10^maxDec/creditMicro) micro-USD.
		if frac != "" {
			f, _ = strconv.ParseInt(frac+strings.Repeat("0", maxDec-len(frac)), 10, 64)
		}
		per := int64(1)
		for range maxDec {
			per *= 10
		}
		per /= creditMicro
		if f%per != 0 {
			return 0, fmt.Errorf("is not a whole number of micro-USD at %d micro-USD per credit", creditMicro)
		}
		return f / per, nil
	}
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	}
	if f > math.MaxInt64/creditMicro {
		return 0, errors.New("is too large")
	}
	fm := f * creditMicro // millionths of a credit times micro-USD per credit
	if fm%1_000_000 != 0 {
		return 0, fmt.Errorf("is not a whole number of micro-USD at %d micro-USD per credit", creditMicro)
	}
	return fm / 1_000_000, nil
}

// digits reports whether s is ASCII digits alone: strconv.ParseInt would take a sign too.
func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
