package admin_test

import (
	"encoding/csv"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
)

// TestReportCSVQuotesEveryFormulaLead: a text cell (user or model) starting with any character
// a spreadsheet reads as the start of a formula (= + - @, or a tab or carriage return before
// one) is written with a quote in front; one starting otherwise is written as it is. Mutant:
// the '@' case dropped (and each other lead's).
func TestReportCSVQuotesEveryFormulaLead(t *testing.T) {
	models := []string{"=1+1", "+1", "-1", "@SUM(A1)", "\t=1", "\r=1", "gpt-a"}
	rep := holds.UsageReport{}
	for _, m := range models {
		rep.Rows = append(rep.Rows, holds.UsageRow{UserName: "@ann", Day: "2026-01-01", Model: m})
	}
	var b strings.Builder
	if err := (admin.Views{CreditMicro: 1000}).WriteReportCSV(&b, rep); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(b.String())).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(models)+1 {
		t.Fatalf("CSV %q: %d records, want a header and %d rows", b.String(), len(recs), len(models))
	}
	for i, m := range models {
		want := "'" + m
		if m == "gpt-a" {
			want = m
		}
		if got := recs[i+1][2]; got != want {
			t.Errorf("model %q written %q, want %q", m, got, want)
		}
		if got := recs[i+1][0]; got != "'@ann" {
			t.Errorf("user @ann written %q, want '@ann", got)
		}
	}
}

// TestKeyListingShowsRevokedKeys: a key revoked shows revoked true with its revoked_at in the
// user's key listing, one still live shows revoked false: an operator checking that a leaked
// key is dead reads it there. Mutant: the key view's revoked always false.
func TestKeyListingShowsRevokedKeys(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "ann"}, http.StatusCreated)
	dead := f.admin("POST", "/admin/users/ann/keys", nil, http.StatusCreated)
	live := f.admin("POST", "/admin/users/ann/keys", nil, http.StatusCreated)
	f.admin("POST", "/admin/keys/revoke", map[string]any{"key": dead["key"]}, http.StatusOK)
	keys := f.admin("GET", "/admin/users/ann/keys", nil, http.StatusOK)
	data, _ := keys["data"].([]any)
	if len(data) != 2 {
		t.Fatalf("keys %v, want 2", keys)
	}
	seen := 0
	for _, k := range data {
		k, _ := k.(map[string]any)
		switch k["prefix"] {
		case dead["prefix"]:
			seen++
			if k["revoked"] != true || k["revoked_at"] == nil {
				t.Errorf("revoked key listed as %v, want revoked true with revoked_at", k)
			}
		case live["prefix"]:
			seen++
			if k["revoked"] != false || k["revoked_at"] != nil {
				t.Errorf("live key listed as %v, want revoked false without revoked_at", k)
			}
		}
	}
	if seen != 2 || dead["prefix"] == live["prefix"] {
		t.Fatalf("keys %v: want the revoked key %v and the live key %v, told apart by prefix", data, dead["prefix"], live["prefix"])
	}
}
