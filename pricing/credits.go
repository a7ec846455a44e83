package pricing

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// FormatCredits shows micro-USD as credits: an exact decimal ("3.412", "-0.5"), never a
// rounded float, because a balance an operator reconciles against a payment must not drift.
// With a creditMicro that does not divide a power of ten, the sixth decimal is truncated.
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
	// millionths of a credit = mag * 1e6 / creditMicro, without overflowing for large amounts.
	cm := uint64(creditMicro)
	whole := mag / cm
	frac := (mag % cm) * 1_000_000 / cm
	out := strconv.FormatUint(whole, 10)
	if frac != 0 {
		f := strconv.FormatUint(frac+1_000_000, 10)[1:]
		out += "." + strings.TrimRight(f, "0")
	}
	if neg && (whole != 0 || frac != 0) {
		out = "-" + out
	}
	return out
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
	if len(frac) > 6 {
		return 0, fmt.Errorf("%w: %q has more than 6 decimals", ErrBadCredits, orig)
	}
	whole = strings.TrimLeft(whole, "0")
	if len(whole) > 12 { // a trillion credits is past any real grant, and keeps the product in int64 range
		return 0, fmt.Errorf("%w: %q is too large", ErrBadCredits, orig)
	}
	var w, f int64
	if whole != "" {
		w, _ = strconv.ParseInt(whole, 10, 64)
	}
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	}
	if w > math.MaxInt64/creditMicro || f > math.MaxInt64/creditMicro {
		return 0, fmt.Errorf("%w: %q is too large", ErrBadCredits, orig)
	}
	fracMicro := f * creditMicro // millionths of a credit times micro-USD per credit
	if fracMicro%1_000_000 != 0 {
		return 0, fmt.Errorf("%w: %q is not a whole number of micro-USD at %d micro-USD per credit", ErrBadCredits, orig, creditMicro)
	}
	micro := w*creditMicro + fracMicro/1_000_000
	if micro < 0 {
		return 0, fmt.Errorf("%w: %q is too large", ErrBadCredits, orig)
	}
	if neg {
		micro = -micro
	}
	return micro, nil
}

func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
