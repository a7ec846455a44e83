package admin_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestRefundBoundAgainstCallsInFlight: a refund may leave exactly what a call in flight holds
// beyond today's allowance, not one micro-USD less, and its refusal names the part of the hold
// the allowance does not cover. Allowance 10 credits, prepaid 100, a call holding 20: 90
// credits are available. Mutants: the store's Available(...) < 0 -> < -1 (a refund leaving
// 0.001 credits less than the hold was granted); the refusal's held figure not net of the
// allowance (20 where 10 is beyond it).
func TestRefundBoundAgainstCallsInFlight(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "ann"}, http.StatusCreated)
	f.admin("PATCH", "/admin/users/ann", map[string]any{"allowance": "10"}, http.StatusOK)
	f.admin("POST", "/admin/users/ann/grants", map[string]any{"amount": "100", "idempotency_key": "ann-topup"}, http.StatusCreated)
	u, err := f.store.UserByName(f.ctx(), "ann")
	if err != nil {
		t.Fatal(err)
	}
	f.admitInOneBatch([]holds.AdmitRequest{{RunID: "r_live", UserID: u.ID, Model: "gpt-a", State: holds.StateRunning, TTL: time.Minute}})
	if b := f.admin("GET", "/admin/users/ann/balance", nil, http.StatusOK); b["held"] != json.Number("20") || b["available"] != json.Number("90") {
		t.Fatalf("balance %v, want held 20 and available 90", b)
	}

	out := f.admin("POST", "/admin/users/ann/grants", map[string]any{"amount": "-90.001", "idempotency_key": "ann-refund-over"}, http.StatusConflict)
	msg, _ := out["error"].(map[string]any)["message"].(string)
	if errCode(out) != "grant_below_zero" || !strings.Contains(msg, "(10 credits of the 100 credits prepaid)") {
		t.Errorf("refund 0.001 past the hold: %v, want grant_below_zero naming the 10 credits held beyond the allowance", out)
	}
	g := f.admin("POST", "/admin/users/ann/grants", map[string]any{"amount": "-90", "idempotency_key": "ann-refund-at"}, http.StatusCreated)
	if g["prepaid_after"] != json.Number("10") {
		t.Errorf("refund to the hold: %v, want prepaid_after 10", g)
	}
	if b := f.admin("GET", "/admin/users/ann/balance", nil, http.StatusOK); b["available"] != json.Number("0") {
		t.Errorf("balance %v, want available 0", b)
	}
}

// TestGrantKeyAndReasonBounds: an idempotency key of 128 bytes and a reason of 255 (the grants
// table's columns) are taken, one byte more is refused 400 and grants nothing; a key in the
// body is the grant's even when an Idempotency-Key header names another. Mutants: the key's
// bound > -> >= and the reason's off by one in holds' validateGrant; the header read whenever
// it is sent.
func TestGrantKeyAndReasonBounds(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "ann"}, http.StatusCreated)
	f.admin("POST", "/admin/users/ann/grants", map[string]any{"amount": "1", "idempotency_key": strings.Repeat("k", 128),
		"reason": strings.Repeat("r", 255)}, http.StatusCreated)
	for _, body := range []map[string]any{
		{"amount": "1", "idempotency_key": strings.Repeat("x", 129)},
		{"amount": "1", "idempotency_key": "evt-reason", "reason": strings.Repeat("r", 256)},
	} {
		if out := f.admin("POST", "/admin/users/ann/grants", body, http.StatusBadRequest); errCode(out) != "invalid_request" {
			t.Errorf("grant %.40v...: %v, want 400 invalid_request", body, out)
		}
	}
	g := f.admin("POST", "/admin/users/ann/grants", map[string]any{"amount": "1", "idempotency_key": "evt-body"}, http.StatusCreated,
		"Idempotency-Key", "evt-header")
	if g["idempotency_key"] != "evt-body" {
		t.Errorf("grant with a key in the body and another in the header: %v, want the body's key", g)
	}
	if b := f.admin("GET", "/admin/users/ann/balance", nil, http.StatusOK); b["prepaid"] != json.Number("2") {
		t.Errorf("prepaid %v, want 2: the two grants taken", b["prepaid"])
	}
}

// TestRefusalWithoutRetryHintSendsNoRetryAfter: a refusal that retrying cannot cure (400, 404,
// 409, 422) carries no Retry-After: a client library would read Retry-After: 0 as "retry at
// once". Mutant: writeError's RetryAfter > 0 -> >= 0.
func TestRefusalWithoutRetryHintSendsNoRetryAfter(t *testing.T) {
	f := newFixture(t, adminToken)
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/admin/users/nobody", nil},
		{"GET", "/admin/users?limit=0", nil},
		{"POST", "/admin/keys/revoke", map[string]any{"key": "tg_nosuchkey"}},
	} {
		req, err := http.NewRequestWithContext(f.ctx(), c.method, f.url+c.path, nil)
		if c.body != nil {
			raw, _ := json.Marshal(c.body)
			req, err = http.NewRequestWithContext(f.ctx(), c.method, f.url+c.path, strings.NewReader(string(raw)))
		}
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("%s %s: %d, want a 4xx refusal", c.method, c.path, resp.StatusCode)
		}
		if ra, ok := resp.Header["Retry-After"]; ok {
			t.Errorf("%s %s: %d with Retry-After %q, want none", c.method, c.path, resp.StatusCode, ra)
		}
	}
}

// TestGrantCursorOfAnotherUserIsRefused: a grants listing's after must be one of the user's
// own grants (a previous page's last_id); another user's grant id is no such cursor and is
// refused 400 invalid_after, as an id that is no grant at all is. Mutant: the cursor's check
// in holds' Grants dropped its user_id condition, and paged from bob's grant, ann's listing
// answered 200 with a page no walk of hers had reached.
func TestGrantCursorOfAnotherUserIsRefused(t *testing.T) {
	f := newFixture(t, adminToken)
	for _, name := range []string{"ann", "bob"} {
		f.admin("POST", "/admin/users", map[string]any{"name": name}, http.StatusCreated)
	}
	f.admin("POST", "/admin/users/ann/grants", map[string]any{"amount": "1", "idempotency_key": "ann-1"}, http.StatusCreated)
	bobs := f.admin("POST", "/admin/users/bob/grants", map[string]any{"amount": "1", "idempotency_key": "bob-1"}, http.StatusCreated)
	for _, after := range []string{string(bobs["id"].(json.Number)), "999999"} {
		if out := f.admin("GET", "/admin/users/ann/grants?after="+after, nil, http.StatusBadRequest); errCode(out) != "invalid_after" {
			t.Errorf("ann's grants after %s: %v, want 400 invalid_after", after, out)
		}
	}
}
