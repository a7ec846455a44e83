package admin_test

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestBodyNamingAFieldTwiceOrInAnotherCaseIsRefused: encoding/json takes the last of two
// members of one name, and matches a member to a field without regard to case, so
// {"amount":"1","AMOUNT":"1000"} granted 1000 credits where a reader of the body (a log, a
// reviewer, a parser that keeps the first) saw 1. A body that says two things, or spells a
// field otherwise than the API does, is refused before anything is done.
func TestBodyNamingAFieldTwiceOrInAnotherCaseIsRefused(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "alice"}, http.StatusCreated)
	for _, body := range []string{
		`{"amount":"1","amount":"1000","idempotency_key":"k1"}`,
		`{"amount":"1","AMOUNT":"1000","idempotency_key":"k2"}`,
		`{"Amount":"5","idempotency_key":"k3"}`,
	} {
		out := f.admin("POST", "/admin/users/alice/grants", body, http.StatusBadRequest)
		if errCode(out) != "invalid_json" {
			t.Errorf("grant %s: %v, want 400 invalid_json", body, out)
		}
	}
	for _, body := range []string{`{"allowance":5,"allowance":null}`, `{"Plan":"guest"}`} {
		out := f.admin("PATCH", "/admin/users/alice", body, http.StatusBadRequest)
		if errCode(out) != "invalid_json" {
			t.Errorf("PATCH %s: %v, want 400 invalid_json", body, out)
		}
	}
	out := f.admin("POST", "/admin/users", `{"name":"bob","name":"carol"}`, http.StatusBadRequest)
	if errCode(out) != "invalid_json" {
		t.Errorf("create with two names: %v, want 400 invalid_json", out)
	}
	u := f.admin("GET", "/admin/users/alice", nil, http.StatusOK)
	if u["prepaid"] != json.Number("0") || u["plan"] != "standard" || u["overrides"].(map[string]any)["allowance"] != nil {
		t.Fatalf("alice: %v, want nothing granted or changed", u)
	}
	if n := len(f.admin("GET", "/admin/users", nil, http.StatusOK)["data"].([]any)); n != 1 {
		t.Fatalf("%d users, want alice alone", n)
	}
	// Nested values are the fields' own business; a well-formed body still passes.
	f.admin("POST", "/admin/users/alice/grants", `{"amount":"2","idempotency_key":"ok","reason":"a \"amount\" b"}`, http.StatusCreated)
}
