package pricing

import (
	"errors"
	"reflect"
	"testing"
)

// TestNewTableRefusesEveryNegativeRate: a negative rate would take money off a call's cost (a
// credit to the caller for using the model), so a price with any rate below zero, even by one
// micro-USD per million tokens, in its own rates or its long-context ones, is refused, and a
// rate of zero (free tokens) is not.
func TestNewTableRefusesEveryNegativeRate(t *testing.T) {
	fields := reflect.TypeOf(Price{})
	for i := range fields.NumField() {
		f := fields.Field(i)
		if f.Type.Kind() != reflect.Int64 || f.Name == "LongAbove" {
			continue
		}
		for _, v := range []int64{-1, 0} {
			p := Price{Input: 1, Output: 1}
			reflect.ValueOf(&p).Elem().Field(i).SetInt(v)
			long := Price{Input: 2, Output: 2}
			reflect.ValueOf(&long).Elem().Field(i).SetInt(v)
			for name, price := range map[string]Price{
				"short": p,
				"long":  {Input: 1, Output: 1, Long: &long, LongAbove: 10},
			} {
				_, err := NewTable(map[string]Price{"m": price})
				if v < 0 && err == nil {
					t.Errorf("%s %s rate %d accepted", name, f.Name, v)
				}
				if v == 0 && err != nil {
					t.Errorf("%s %s rate 0 refused: %v", name, f.Name, err)
				}
			}
		}
	}
}

// TestUsageAddAndSubAreFieldWise: a run's usage is the sum of its calls' and a correction is a
// difference, each token kind billed at its own price: a field added into another's (cache
// reads counted as writes) or a difference taken with the wrong sign bills tokens at the wrong
// rate. Every field is given its own value, so any crossing shows.
func TestUsageAddAndSubAreFieldWise(t *testing.T) {
	var u, o Usage
	uv, ov := reflect.ValueOf(&u).Elem(), reflect.ValueOf(&o).Elem()
	for i := range uv.NumField() {
		uv.Field(i).SetInt(int64(1000 * (i + 1)))
		ov.Field(i).SetInt(int64(i + 1))
	}
	sum, diff := reflect.ValueOf(u.Add(o)), reflect.ValueOf(u.Sub(o))
	for i := range uv.NumField() {
		name := uv.Type().Field(i).Name
		if got, want := sum.Field(i).Int(), int64(1001*(i+1)); got != want {
			t.Errorf("Add: %s = %d, want %d", name, got, want)
		}
		if got, want := diff.Field(i).Int(), int64(999*(i+1)); got != want {
			t.Errorf("Sub: %s = %d, want %d", name, got, want)
		}
	}
}

// TestParseCreditsRefusesWhatWouldWrap: at the largest exact credit_micro (10^18 micro-USD a
// credit), an amount past int64 micro-USD is refused, not wrapped: 20 credits would wrap to a
// positive 1.55·10^18 micro-USD (a grant of another amount than typed), and 9.3 credits, whose
// whole part fits but whose fraction pushes it past, to a negative one (a grant that debits).
// The largest amount that fits still parses exactly.
func TestParseCreditsRefusesWhatWouldWrap(t *testing.T) {
	const per = 1_000_000_000_000_000_000
	for _, in := range []string{"20", "10", "9.3", "9.223372036854775808", "-9.3"} {
		if got, err := ParseCredits(in, per); !errors.Is(err, ErrBadCredits) {
			t.Errorf("ParseCredits(%q, 10^18) = %d, %v; want ErrBadCredits", in, got, err)
		}
	}
	if got, err := ParseCredits("9.223372036854775807", per); err != nil || got != 9_223_372_036_854_775_807 {
		t.Errorf("ParseCredits of MaxInt64 micro-USD = %d, %v", got, err)
	}
}

// TestParseCreditsRefusesPartOfAMicroUSDAtADearCredit: at a credit worth 5 USD (5 000 000
// micro-USD, seven decimals), one ten-millionth of a credit is half a micro-USD: refused, not
// rounded to nothing (a grant must credit exactly what was typed), while two are one micro-USD.
func TestParseCreditsRefusesPartOfAMicroUSDAtADearCredit(t *testing.T) {
	if got, err := ParseCredits("0.0000001", 5_000_000); !errors.Is(err, ErrBadCredits) {
		t.Errorf("half a micro-USD: %d, %v; want ErrBadCredits", got, err)
	}
	if got, err := ParseCredits("1.0000003", 5_000_000); !errors.Is(err, ErrBadCredits) {
		t.Errorf("5 USD and a half micro-USD more: %d, %v; want ErrBadCredits", got, err)
	}
	if got, err := ParseCredits("0.0000002", 5_000_000); err != nil || got != 1 {
		t.Errorf("one micro-USD: %d, %v; want 1", got, err)
	}
}
