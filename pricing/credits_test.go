package pricing

import (
	"errors"
	"math"
	"testing"
)

func TestFormatCredits(t *testing.T) {
	cases := []struct {
		micro, per int64
		want       string
	}{
		{0, 1000, "0"},
		{3_412, 1000, "3.412"},
		{-500, 1000, "-0.5"},
		{2_000_000, 1000, "2000"},
		{1, 1000, "0.001"},
		{1, 3, "0.333333"},
		{-1, 3_000_000, "0"}, // below a millionth of a credit: truncated, and no "-0"
		{math.MaxInt64, 1, "9223372036854775807"},
		{math.MinInt64, 1, "-9223372036854775808"},
		{math.MinInt64, 1000, "-9223372036854775.808"},
		{1, 5_000_000, "0.0000002"}, // a $5 credit: exact, with 7 decimals
		{15, 10_000_000, "0.0000015"},
		{1, 1024, "0.0009765625"},
	}
	for _, c := range cases {
		if got := FormatCredits(c.micro, c.per); got != c.want {
			t.Errorf("FormatCredits(%d, %d) = %q, want %q", c.micro, c.per, got, c.want)
		}
	}
}

func TestParseCredits(t *testing.T) {
	ok := []struct {
		in   string
		per  int64
		want int64
	}{
		{"12.5", 1000, 12_500},
		{"-3", 1000, -3_000},
		{"+0.001", 1000, 1},
		{" 7 ", 1000, 7_000},
		{"0.100000", 1000, 100},
		{"007.250", 1000, 7_250},
		{".5", 1000, 500},
		{"1.5", 2, 3},
		{"999999999999", 1000, 999_999_999_999_000},
	}
	for _, c := range ok {
		got, err := ParseCredits(c.in, c.per)
		if err != nil || got != c.want {
			t.Errorf("ParseCredits(%q, %d) = %d, %v; want %d", c.in, c.per, got, err, c.want)
		}
	}
	bad := []struct {
		in  string
		per int64
	}{
		{"", 1000}, {"-", 1000}, {".", 1000}, {"1.", 1000}, {"1e3", 1000}, {"abc", 1000}, {"1,5", 1000},
		{"0.0001", 1000},          // a tenth of a micro-USD
		{"0.0000001", 1_000_000},  // seven decimals
		{"1000000000000", 1000},   // 13 digits
		{"999999999999", 1 << 40}, // overflows int64 micro-USD
		{"--1", 1000},
	}
	for _, c := range bad {
		if got, err := ParseCredits(c.in, c.per); !errors.Is(err, ErrBadCredits) {
			t.Errorf("ParseCredits(%q, %d) = %d, %v; want ErrBadCredits", c.in, c.per, got, err)
		}
	}
	// What is formatted parses back to the same amount, at any exact credit_micro.
	for _, per := range []int64{1000, 5_000_000, 10_000_000, 1024, 1} {
		for _, m := range []int64{1, -1, 3, 15, 123_456_789} {
			got, err := ParseCredits(FormatCredits(m, per), per)
			if err != nil || got != m {
				t.Errorf("round trip %d at %d: %q -> %d, %v", m, per, FormatCredits(m, per), got, err)
			}
		}
	}
	for _, m := range []int64{0, 1, -1, 3_412, -2_000_000, 123_456_789} {
		got, err := ParseCredits(FormatCredits(m, 1000), 1000)
		if err != nil || got != m {
			t.Errorf("round trip %d: %d, %v", m, got, err)
		}
	}
}

// TestFormatCreditsLargeInexactCredit: an inexact credit_micro shows six truncated decimals;
// past about 1.8e13 micro-USD per credit the remainder times a million overflowed uint64, and
// the decimals shown were garbage.
func TestFormatCreditsLargeInexactCredit(t *testing.T) {
	const per = 3_000_000_000_000_000 // 3·10^15: a factor of 3, so inexact
	if got, want := FormatCredits(per-1, per), "0.999999"; got != want {
		t.Errorf("FormatCredits(%d, %d) = %q, want %q", int64(per-1), int64(per), got, want)
	}
	if got, want := FormatCredits(-(2*per+per/2), per), "-2.5"; got != want {
		t.Errorf("FormatCredits(%d, %d) = %q, want %q", -(2*per + per/2), int64(per), got, want)
	}
}
