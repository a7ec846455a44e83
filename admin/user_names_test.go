package admin_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestCreateUserNameRule: the name rule moved from this package into the store (so that the
// gateway's `user create` keeps it too); the API's answers stay as they were: 400
// invalid_name, before the plan is looked at, and a bad plan with a good name still 400
// unknown_plan naming the configured plans.
func TestCreateUserNameRule(t *testing.T) {
	f := newFixture(t, adminToken)
	for _, name := range []string{"", "a b", "a/b", "-lead", "caf\u00e9", strings.Repeat("x", 129)} {
		for _, plan := range []string{"", "no-such-plan"} {
			out := f.admin("POST", "/admin/users", map[string]any{"name": name, "plan": plan}, http.StatusBadRequest)
			if errCode(out) != "invalid_name" {
				t.Errorf("name %q plan %q: %v, want 400 invalid_name", name, plan, out)
			}
		}
	}
	out := f.admin("POST", "/admin/users", map[string]any{"name": "ok", "plan": "no-such-plan"}, http.StatusBadRequest)
	if msg := out["error"].(map[string]any)["message"].(string); errCode(out) != "unknown_plan" || !strings.Contains(msg, "configured: guest, standard") {
		t.Errorf("unknown plan: %v, want 400 unknown_plan naming the configured plans", out)
	}
	f.admin("POST", "/admin/users", map[string]any{"name": strings.Repeat("x", 128)}, http.StatusCreated)
	if n := len(f.admin("GET", "/admin/users", nil, http.StatusOK)["data"].([]any)); n != 1 {
		t.Fatalf("%d users, want the one valid name", n)
	}
}

// TestCreateUserCaseOnlyIsRefusedNamingTheUser: names are compared without regard to case
// (the column's collation), as `gateway user create` compares them: "alice" beside "Alice" is
// 409 user_exists, which said only "A user of that name exists." though no listed user has
// that name; it names the user matched. /users/{name} reaches the user under either case.
func TestCreateUserCaseOnlyIsRefusedNamingTheUser(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "Alice"}, http.StatusCreated)
	out := f.admin("POST", "/admin/users", map[string]any{"name": "alice"}, http.StatusConflict)
	if msg := out["error"].(map[string]any)["message"].(string); errCode(out) != "user_exists" || !strings.Contains(msg, `"Alice"`) {
		t.Fatalf("alice beside Alice: %v, want 409 user_exists naming Alice", out)
	}
	if u := f.admin("GET", "/admin/users/ALICE", nil, http.StatusOK); u["name"] != "Alice" {
		t.Fatalf("GET /admin/users/ALICE: %v, want Alice", u)
	}
	if n := len(f.admin("GET", "/admin/users", nil, http.StatusOK)["data"].([]any)); n != 1 {
		t.Fatalf("%d users, want Alice alone", n)
	}
}

// TestNameOnlyTheCollationMatchesReachesNoUser: names are compared without regard to ASCII
// case, and otherwise as they are. The column's collation also folds accents and ignores
// trailing spaces, so a name no user can have (the name rule refuses "alicé", "alice ",
// "ALİCE") reached alice: a grant typed for a customer "josé" credited a user "jose".
func TestNameOnlyTheCollationMatchesReachesNoUser(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "alice"}, http.StatusCreated)
	for _, p := range []string{"alic%C3%A9", "alice%20", "AL%C4%B0CE"} {
		out := f.admin("POST", "/admin/users/"+p+"/grants", map[string]any{"amount": "5", "idempotency_key": "k-" + p}, http.StatusNotFound)
		if errCode(out) != "user_not_found" {
			t.Errorf("grant to %s: %v, want 404 user_not_found", p, out)
		}
		f.admin("GET", "/admin/users/"+p, nil, http.StatusNotFound)
		f.admin("GET", "/admin/runs?user="+p, nil, http.StatusNotFound)
	}
	if u := f.admin("GET", "/admin/users/ALICE", nil, http.StatusOK); u["prepaid"] != json.Number("0") {
		t.Fatalf("alice: %v, want nothing credited", u)
	}
}
