package admin_test

import (
	"net/http"
	"testing"
)

// TestZeroGrantIsABadAmount: a grant of 0 credits ("0", "-0", "0.000", 0) credits nothing and
// can never succeed; what is wrong with it is its amount, which a script fixes by hand as it
// does "12,50". It was answered invalid_request, the code of a missing or unusable key, while
// every other amount that cannot be granted is invalid_amount (README § Admin API). It is
// invalid_amount, and grants nothing.
func TestZeroGrantIsABadAmount(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "ann"}, http.StatusCreated)
	before := f.snapshot()
	for i, amount := range []any{"0", "-0", "0.000", 0} {
		out := f.admin("POST", "/admin/users/ann/grants", map[string]any{"amount": amount, "idempotency_key": "zero-" + string(rune('a'+i))}, http.StatusBadRequest)
		if errCode(out) != "invalid_amount" {
			t.Errorf("amount %v: %v, want invalid_amount", amount, out)
		}
	}
	if after := f.snapshot(); after != before {
		t.Errorf("a refused grant changed state:\nbefore %s\nafter  %s", before, after)
	}
}
