package holds

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEStatesTheGrantBounds: a grant's idempotency key and reason have bounds (the grants
// table's columns), and a grant past either is refused — 400 invalid_request from the admin
// API, an error from `gateway grant` — before anything is written. README's admin routes are
// where an operator wiring a payment webhook reads what a grant takes (a provider's event id
// as the key, a description as the reason), so the bounds the code holds must be the ones it
// states, or a webhook sending a longer event id finds out from a refused grant.
func TestREADMEStatesTheGrantBounds(t *testing.T) {
	ok := GrantRequest{UserID: 1, AmountMicro: 1000, IdempotencyKey: "k", Reason: "r"}
	for _, tc := range []struct {
		name  string
		req   GrantRequest
		valid bool
	}{
		{"key at its bound", withKey(ok, strings.Repeat("k", maxGrantKeyLen)), true},
		{"key past its bound", withKey(ok, strings.Repeat("k", maxGrantKeyLen+1)), false},
		{"reason at its bound", withReason(ok, strings.Repeat("r", maxGrantReasonLen)), true},
		{"reason past its bound", withReason(ok, strings.Repeat("r", maxGrantReasonLen+1)), false},
	} {
		err := validateGrant(tc.req)
		if tc.valid != (err == nil) || (err != nil && !errors.Is(err, ErrGrantInvalid)) {
			t.Errorf("%s: validateGrant = %v", tc.name, err)
		}
	}

	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(raw)), " ")
	for _, want := range []string{
		fmt.Sprintf(`grant key is 1[–-]%d bytes`, maxGrantKeyLen),
		fmt.Sprintf(`reason at most %d bytes`, maxGrantReasonLen),
	} {
		if !regexp.MustCompile(want).MatchString(readme) {
			t.Errorf("README does not state %q: the code refuses a grant past it", want)
		}
	}
}

func withKey(r GrantRequest, k string) GrantRequest    { r.IdempotencyKey = k; return r }
func withReason(r GrantRequest, s string) GrantRequest { r.Reason = s; return r }
