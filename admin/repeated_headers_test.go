package admin_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestHeaderSentTwiceIsRefused: Authorization and a grant's Idempotency-Key are single-valued
// (RFC 9110 §5.3), and the admin API read the first of two lines: a grant whose first
// Idempotency-Key line was empty was taken without the key its retry would be known by, and
// paid twice when the retry came. Either header on more than one line is refused 400
// invalid_request, as a query parameter given twice is, and nothing changes.
func TestHeaderSentTwiceIsRefused(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "ann"}, http.StatusCreated)
	before := f.snapshot()
	for _, tc := range []struct {
		header, body string
		lines        []string
	}{
		// A grant that one Authorization line would have let through: keyed in its body.
		{"Authorization", `{"amount":"5","idempotency_key":"evt-auth"}`, []string{"Bearer " + adminToken, "Bearer " + adminToken}},
		{"Authorization", `{"amount":"5","idempotency_key":"evt-auth"}`, []string{"", "Bearer " + adminToken}},
		{"Authorization", `{"amount":"5","idempotency_key":"evt-auth"}`, []string{"Bearer " + adminToken, "Bearer wrong"}},
		{"Idempotency-Key", `{"amount":"5"}`, []string{"", "evt-1"}},
		{"Idempotency-Key", `{"amount":"5"}`, []string{"evt-1", "evt-2"}},
	} {
		req, err := http.NewRequestWithContext(f.ctx(), http.MethodPost, f.url+"/admin/users/ann/grants", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if tc.header != "Authorization" {
			req.Header.Set("Authorization", "Bearer "+adminToken)
		}
		for _, v := range tc.lines {
			req.Header.Add(tc.header, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || errCode(out) != "invalid_request" {
			t.Errorf("%s sent as %q: %d %v, want 400 invalid_request", tc.header, tc.lines, resp.StatusCode, out)
		}
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// Sent once, the grant is taken under the header's key.
	if g := f.admin("POST", "/admin/users/ann/grants", map[string]any{"amount": "5"}, http.StatusCreated, "Idempotency-Key", "evt-1"); g["idempotency_key"] != "evt-1" {
		t.Errorf("grant with one Idempotency-Key line: %v, want key evt-1", g)
	}
}
