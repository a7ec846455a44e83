package admin_test

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
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

// TestGrantListingPages: the grant listing (newest first) stopped at its limit (at most 1 000)
// with no way to the older ones; an auditor reconciling payments needs them all. It pages as
// the runs listing does: has_more, last_id, and ?after=<last_id> for the next page.
func TestGrantListingPages(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "payer"}, http.StatusCreated)
	for i := range 5 {
		f.admin("POST", "/admin/users/payer/grants", map[string]any{"amount": "1", "idempotency_key": "evt_" + strconv.Itoa(i)}, http.StatusCreated)
	}
	var keys []string
	path := "/admin/users/payer/grants?limit=2"
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("the listing never ends")
		}
		out := f.admin("GET", path, nil, http.StatusOK)
		for _, g := range out["data"].([]any) {
			keys = append(keys, g.(map[string]any)["idempotency_key"].(string))
		}
		if out["has_more"] != true {
			break
		}
		path = "/admin/users/payer/grants?limit=2&after=" + fmt.Sprint(out["last_id"])
	}
	if want := []string{"evt_4", "evt_3", "evt_2", "evt_1", "evt_0"}; !slices.Equal(keys, want) {
		t.Fatalf("paged grants %v, want %v (newest first, each once)", keys, want)
	}
	if bad := f.admin("GET", "/admin/users/payer/grants?after=x", nil, http.StatusBadRequest); errCode(bad) != "invalid_after" {
		t.Fatalf("after=x: %v, want 400 invalid_after", bad)
	}
}
