package admin_test

import (
	"fmt"
	"net/http"
	"testing"
)

// TestEveryAdminRefusalNamesItsCode: scripts tell an admin API's refusals apart by their code
// (a bad amount is fixed by hand, an unknown plan by configuring it), so each 400 is asserted
// by the code it answers with, not by its status alone, and none changes state.
func TestEveryAdminRefusalNamesItsCode(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "acme"}, http.StatusCreated)
	f.admin("POST", "/admin/users", map[string]any{"name": "other"}, http.StatusCreated)
	otherGrant := f.admin("POST", "/admin/users/other/grants", map[string]any{"amount": "1", "idempotency_key": "other-1"}, http.StatusCreated)
	before := f.snapshot()
	for _, c := range []struct {
		method, path string
		body         any
		code         string
	}{
		{"POST", "/admin/users", map[string]any{"name": "a/b"}, "invalid_name"},
		{"POST", "/admin/users", map[string]any{"name": "x", "plan": "gold"}, "unknown_plan"},
		{"PATCH", "/admin/users/acme", map[string]any{"plan": "gold"}, "unknown_plan"},
		{"POST", "/admin/users", map[string]any{"name": "x", "plna": "guest"}, "invalid_json"},
		{"POST", "/admin/users", `{"name":"x"} {}`, "invalid_json"},
		{"POST", "/admin/users", `{"name":`, "invalid_json"},
		{"PATCH", "/admin/users/acme", map[string]any{"discount_bp": 10001}, "invalid_discount"},
		{"PATCH", "/admin/users/acme", map[string]any{"max_in_flight": 0}, "invalid_max_in_flight"},
		{"PATCH", "/admin/users/acme", map[string]any{"allowance": "-1"}, "invalid_allowance"},
		{"POST", "/admin/users/acme/grants", map[string]any{"amount": "1"}, "invalid_request"},
		{"POST", "/admin/users/acme/grants", `{"amount":"1","idempotency_key":"a\ud800"}`, "invalid_request"},
		{"POST", "/admin/users/acme/grants", map[string]any{"amount": "1e3", "idempotency_key": "k1"}, "invalid_amount"},
		{"POST", "/admin/users/acme/grants", map[string]any{"amount": "0.0000001", "idempotency_key": "k2"}, "invalid_amount"},
		// An amount that is no number at all is a bad amount too, not a bad body: a webhook's
		// "12,50" or "" was answered invalid_json in encoding/json's words.
		{"POST", "/admin/users/acme/grants", map[string]any{"amount": "12,50", "idempotency_key": "k3"}, "invalid_amount"},
		{"POST", "/admin/users/acme/grants", map[string]any{"amount": "", "idempotency_key": "k4"}, "invalid_amount"},
		{"POST", "/admin/users/acme/grants", map[string]any{"amount": true, "idempotency_key": "k5"}, "invalid_amount"},
		{"POST", "/admin/users/acme/grants", map[string]any{"idempotency_key": "k6"}, "invalid_amount"},
		{"POST", "/admin/keys/revoke", map[string]any{}, "missing_key"},
		{"POST", "/admin/users/acme/keys/revoke", map[string]any{"prefix": "tg_"}, "invalid_request"},
		{"GET", "/admin/users?limit=0", nil, "invalid_limit"},
		{"GET", "/admin/users?after=%FF", nil, "invalid_after"},
		{"GET", "/admin/runs?after=r_nope", nil, "invalid_after"},
		// A grant id that is none of the user's paged from it as if it were.
		{"GET", "/admin/users/acme/grants?after=99999999", nil, "invalid_after"},
		{"GET", fmt.Sprintf("/admin/users/acme/grants?after=%v", otherGrant["id"]), nil, "invalid_after"},
		{"GET", "/admin/runs?since=yesterday", nil, "invalid_since"},
		{"GET", "/admin/runs?until=yesterday", nil, "invalid_until"},
		{"GET", "/admin/runs?settled_since=yesterday", nil, "invalid_settled_since"},
		{"GET", "/admin/runs?settled_until=yesterday", nil, "invalid_settled_until"},
		{"GET", "/admin/runs?state=lost", nil, "invalid_request"},
		{"GET", "/admin/reports/usage?from=01/02/2000", nil, "invalid_from"},
		{"GET", "/admin/reports/usage?to=01/02/2000", nil, "invalid_to"},
		{"GET", "/admin/reports/usage?format=xml", nil, "invalid_format"},
		// A misspelt filter answered for every user.
		{"GET", "/admin/reports/usage?userr=acme", nil, "unknown_parameter"},
		{"GET", "/admin/runs?usr=acme&state=settled", nil, "unknown_parameter"},
		{"GET", "/admin/users?limt=5", nil, "unknown_parameter"},
		{"GET", "/admin/users/acme/balance?x=1", nil, "unknown_parameter"},
	} {
		status, out, raw := f.call(c.method, c.path, adminToken, c.body)
		if status != http.StatusBadRequest || errCode(out) != c.code {
			t.Errorf("%s %s %v: %d %s, want 400 %s", c.method, c.path, c.body, status, raw, c.code)
		}
	}
	if after := f.snapshot(); after != before {
		t.Errorf("a refused request changed state:\nbefore %s\nafter  %s", before, after)
	}
}
