package proxy

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestErrorCodesAreKnown: every error code written in the model API's and the admin API's
// source is one of errorCodes, so each is counted under its own code in
// tollgate_error_answers_total and not as "other"; and a code outside the set is counted as
// "other", so no code, whatever made it, opens a series of its own.
func TestErrorCodesAreKnown(t *testing.T) {
	// A code is written as an apiError's Code, as the first argument of a 400's constructor,
	// or as the code of an admin PATCH's override.
	written := regexp.MustCompile(`Code: *"([a-z0-9_]+)"|[bB]adRequest\("([a-z0-9_]+)"|override\(w, [^,]+, "([a-z0-9_]+)"`)
	seen := 0
	for _, dir := range []string{".", "../admin"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if regexp.MustCompile(`_test\.go$`).MatchString(f) {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range written.FindAllStringSubmatch(string(src), -1) {
				code := m[1] + m[2] + m[3]
				if code == "invalid_" { // "invalid_"+field: the route's fields, added to the set from routes
					continue
				}
				seen++
				if !errorCodes[code] {
					t.Errorf("%s writes error code %q, which errorCodes does not list: it would be counted as \"other\"", f, code)
				}
			}
		}
	}
	if seen < 60 {
		t.Fatalf("found %d codes written in the source; the pattern no longer matches how codes are written", seen)
	}
	for _, f := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of"} {
		if !errorCodes["invalid_"+f] {
			t.Errorf("invalid_%s (a bad %s) is not in errorCodes", f, f)
		}
	}

	m := NewMetrics(nil)
	m.CountError(400, "made_up_by_someone")
	m.CountError(999, "invalid_json")
	if got := testutil.ToFloat64(m.ErrorAnswers.WithLabelValues("400", "other")); got != 1 {
		t.Errorf(`an unknown code counted %v under code="other", want 1`, got)
	}
	if got := testutil.ToFloat64(m.ErrorAnswers.WithLabelValues("9xx", "invalid_json")); got != 1 {
		t.Errorf(`status 999 counted %v under status="9xx", want 1`, got)
	}
	if n := testutil.CollectAndCount(m.ErrorAnswers); n != 2 {
		t.Errorf("%d series after two answers, want 2", n)
	}
}
