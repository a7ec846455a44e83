package admin_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"testing"
)

// TestWritesRefuseWhatTheyDoNotRead: a write's query string was never looked at, and the
// routes that take no body (key creation, disable, enable) never read theirs, so
// PATCH /users/acme?plan=guest with {} answered 200 with the user unchanged, and a key asked
// for with {"expires_in":3600} was created live for ever, each looking done. They are refused
// as a listing's misspelt filter is (unknown_parameter, invalid_json), with nothing changed;
// no body, or {}, is still what those routes take.
func TestWritesRefuseWhatTheyDoNotRead(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "acme"}, http.StatusCreated)
	before := f.snapshot()
	for _, c := range []struct {
		method, path string
		body         any
		code         string
	}{
		{"PATCH", "/admin/users/acme?plan=guest", map[string]any{}, "unknown_parameter"},
		{"POST", "/admin/users?name=bob", map[string]any{"name": "acme2"}, "unknown_parameter"},
		{"POST", "/admin/users/acme/grants?amount=1000", map[string]any{"amount": "1", "idempotency_key": "q1"}, "unknown_parameter"},
		{"POST", "/admin/users/acme/keys?expires_in=3600", nil, "unknown_parameter"},
		{"POST", "/admin/users/acme/keys", map[string]any{"expires_in": 3600}, "invalid_json"},
		{"POST", "/admin/users/acme/disable", map[string]any{"reason": "fraud", "until": "2027-01-01"}, "invalid_json"},
		{"POST", "/admin/users/acme/enable", `not json`, "invalid_json"},
		// null is no object: refused as any other body, not taken for none. Mutant: noBody's
		// fields == nil dropped.
		{"POST", "/admin/users/acme/disable", `null`, "invalid_json"},
	} {
		status, out, raw := f.call(c.method, c.path, adminToken, c.body)
		if status != http.StatusBadRequest || errCode(out) != c.code {
			t.Errorf("%s %s %v: %d %s, want 400 %s", c.method, c.path, c.body, status, raw, c.code)
		}
	}
	if after := f.snapshot(); after != before {
		t.Errorf("a refused request changed state:\nbefore %s\nafter  %s", before, after)
	}
	f.admin("POST", "/admin/users/acme/keys", nil, http.StatusCreated)
	f.admin("POST", "/admin/users/acme/keys", `{}`, http.StatusCreated)
	f.admin("POST", "/admin/users/acme/disable", nil, http.StatusOK)
	f.admin("POST", "/admin/users/acme/enable", " {} \n", http.StatusOK)
}

// TestQueryParameterGivenTwiceIsRefused: of a parameter given twice only the first was read,
// so a report asked for ?user=alice&user=bob (both, to the operator) answered for alice alone,
// its totals short by bob's, and ?state=queued&state=running listed the queued runs only.
func TestQueryParameterGivenTwiceIsRefused(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "alice"}, http.StatusCreated)
	f.admin("POST", "/admin/users", map[string]any{"name": "bob"}, http.StatusCreated)
	for _, path := range []string{
		"/admin/reports/usage?user=alice&user=bob",
		"/admin/runs?state=queued&state=running",
		"/admin/users?limit=1&limit=1000",
		"/admin/users/alice/grants?after=&after=5",
	} {
		status, out, raw := f.call("GET", path, adminToken, nil)
		if status != http.StatusBadRequest || errCode(out) != "invalid_request" {
			t.Errorf("GET %s: %d %s, want 400 invalid_request", path, status, raw)
		}
	}
}

// TestCompressedBodyIsRefusedByName: the admin API reads a body as the JSON it is sent as, as
// the model API does. A gzip body was answered 400 invalid_json ("invalid character '\x1f'"),
// which sent its author looking for a JSON mistake, and a plain body labelled gzip was taken.
// Both are 415 unsupported_content_encoding now, with nothing changed; identity is no coding.
func TestCompressedBodyIsRefusedByName(t *testing.T) {
	f := newFixture(t, adminToken)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write([]byte(`{"name":"acme"}`)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	before := f.snapshot()
	for _, c := range []struct {
		what, body, coding string
	}{
		{"a gzip body", gz.String(), "gzip"},
		{"a plain body labelled gzip", `{"name":"acme"}`, "gzip"},
		{"a plain body labelled identity, then br", `{"name":"acme"}`, "identity, br"},
	} {
		status, out, raw := f.call("POST", "/admin/users", adminToken, c.body, "Content-Encoding", c.coding)
		if status != http.StatusUnsupportedMediaType || errCode(out) != "unsupported_content_encoding" {
			t.Errorf("%s: %d %s, want 415 unsupported_content_encoding", c.what, status, raw)
		}
	}
	if after := f.snapshot(); after != before {
		t.Errorf("a refused request changed state:\nbefore %s\nafter  %s", before, after)
	}
	f.admin("POST", "/admin/users", `{"name":"acme"}`, http.StatusCreated, "Content-Encoding", "identity")
}
