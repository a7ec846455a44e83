package admin_test

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestGrantKeysJSONWouldMergeAreRefused: encoding/json turns bytes that are not UTF-8, and
// escaped unpaired surrogates, into U+FFFD without an error, so two different idempotency keys
// in grant bodies ("evt_\xff" and "evt_\xfe", "evt_\ud800" and "evt_\udbff") arrived as one
// key: the second payment was answered as a replay of the first and never credited. Such a key
// is refused (as the same bytes in the Idempotency-Key header are), and nothing is granted.
func TestGrantKeysJSONWouldMergeAreRefused(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "payer"}, http.StatusCreated)
	for _, pair := range [][2]string{
		{"{\"amount\":\"5\",\"idempotency_key\":\"evt_\xff\"}", "{\"amount\":\"5\",\"idempotency_key\":\"evt_\xfe\"}"},
		{`{"amount":"5","idempotency_key":"evt2_\ud800"}`, `{"amount":"5","idempotency_key":"evt2_\udbff"}`},
	} {
		for _, body := range pair {
			status, out, raw := f.call("POST", "/admin/users/payer/grants", adminToken, body)
			if status != http.StatusBadRequest || errCode(out) == "<not an OpenAI error shape>" {
				t.Errorf("grant %q: %d %s, want 400: the key cannot be told apart from another", body, status, raw)
			}
		}
	}
	if b := f.admin("GET", "/admin/users/payer/balance", nil, http.StatusOK); b["prepaid"] != json.Number("0") {
		t.Fatalf("prepaid %v after refused grants, want 0", b["prepaid"])
	}
	// A plain key still works.
	f.admin("POST", "/admin/users/payer/grants", map[string]any{"amount": "5", "idempotency_key": "evt_ok"}, http.StatusCreated)
}
