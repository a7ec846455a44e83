package admin_test

import (
	"net/http"
	"testing"
)

// TestKeyListingIsBounded: a user's keys were listed whole, however many an operator (or a
// script run away) had issued; the listing takes limit (default 100, at most 1000) as the
// other listings do, newest first.
func TestKeyListingIsBounded(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "keyed"}, http.StatusCreated)
	for range 3 {
		f.admin("POST", "/admin/users/keyed/keys", nil, http.StatusCreated)
	}
	out := f.admin("GET", "/admin/users/keyed/keys?limit=2", nil, http.StatusOK)
	data, _ := out["data"].([]any)
	if len(data) != 2 {
		t.Fatalf("limit=2 listed %d keys: %v", len(data), out)
	}
	if all := f.admin("GET", "/admin/users/keyed/keys", nil, http.StatusOK); len(all["data"].([]any)) != 3 {
		t.Fatalf("default listing: %v, want the 3 keys", all)
	}
	if bad := f.admin("GET", "/admin/users/keyed/keys?limit=0", nil, http.StatusBadRequest); errCode(bad) != "invalid_limit" {
		t.Fatalf("limit=0: %v, want 400 invalid_limit", bad)
	}
}
