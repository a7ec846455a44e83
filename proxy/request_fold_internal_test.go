package proxy

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// BenchmarkRepeatedKey is the repeated-key check on a body of many distinct keys, the worst
// a caller with a valid key can send it before admission (it runs on every model request).
func BenchmarkRepeatedKey(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","messages":[]`)
	for i := 0; sb.Len() < 1<<20; i++ {
		sb.WriteString(`,"`)
		sb.WriteString(strconv.FormatInt(int64(i), 36))
		sb.WriteString(`":0`)
	}
	sb.WriteString(`}`)
	root := gjson.Parse(sb.String())
	b.SetBytes(int64(sb.Len()))
	for b.Loop() {
		if k, ok := repeatedKey(root, readKeys...); ok {
			b.Fatalf("repeated key %q in a body of distinct keys", k)
		}
	}
}

// foldKey folds as strings.EqualFold compares, on its ASCII fast path and off it.
func TestFoldKeyMatchesEqualFold(t *testing.T) {
	words := []string{"model", "MODEL", "Model", "mOdEl", "stream", "ſtream", "STREAM", "kelvin", "\u212Aelvin", "Kelvin", "n", "N", "best_of", "BEST_OF", "ß", "ẞ", "straße"}
	for _, a := range words {
		for _, b := range words {
			if got, want := foldKey(a) == foldKey(b), strings.EqualFold(a, b); got != want {
				t.Errorf("foldKey(%q) == foldKey(%q) is %v, strings.EqualFold says %v", a, b, got, want)
			}
		}
	}
}

// compareFolded orders keys as their foldKey does, without folding ASCII ones: repeatedKeyEach
// sorts a wide object's keys with it and takes neighbours it calls equal for a repeat.
func TestCompareFoldedOrdersAsFoldKey(t *testing.T) {
	words := []string{"model", "MODEL", "Model", "mOdEl", "models", "mode", "stream", "ſtream", "STREAM", "kelvin", "\u212Aelvin", "Kelvin",
		"n", "N", "best_of", "BEST_OF", "ß", "ẞ", "straße", "", "_", "[", "a1", "A1"}
	for _, a := range words {
		for _, b := range words {
			if got, want := sign(compareFolded(a, b)), sign(strings.Compare(foldKey(a), foldKey(b))); got != want {
				t.Errorf("compareFolded(%q, %q) is %d, foldKey's order says %d", a, b, got, want)
			}
		}
	}
}

// sign is -1, 0 or 1 as n is negative, zero or positive.
func sign(n int) int {
	return min(1, max(-1, n))
}

// nestedDeeperThan counts only brackets outside strings, escaped quotes included.
func TestNestedDeeperThanSkipsStrings(t *testing.T) {
	for _, tc := range []struct {
		body  string
		limit int
		want  bool
	}{
		{`{"a":[[1]]}`, 3, false},
		{`{"a":[[[1]]]}`, 3, true},
		{`{"a":"[[[[[[","b":"\"[[[[["}`, 1, false},
		{`{"a":"\\","b":[[1]]}`, 2, true},
		{`[]`, 1, false},
	} {
		if got := nestedDeeperThan([]byte(tc.body), tc.limit); got != tc.want {
			t.Errorf("nestedDeeperThan(%s, %d) = %v, want %v", tc.body, tc.limit, got, tc.want)
		}
	}
}
