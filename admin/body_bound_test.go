package admin_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// bodyBound is the admin API's bound on a request body (maxBodyBytes), as its 413 names it.
const bodyBound = 64 << 10

// paddedGrant is a grant body of exactly n bytes: the JSON object, then spaces.
func paddedGrant(t *testing.T, key string, n int) string {
	t.Helper()
	b := fmt.Sprintf(`{"amount":"5","idempotency_key":%q}`, key)
	if len(b) > n {
		t.Fatalf("grant body %d bytes, over %d", len(b), n)
	}
	return b + strings.Repeat(" ", n-len(b))
}

// TestBodyBoundIsExact: a body of exactly the bound (64 KiB) is read and granted, one byte more
// is refused 413 and grants nothing, whether its length is declared or it comes chunked; and a
// declared length one byte over is refused before a client waiting on Expect: 100-continue is
// told to send it. Mutants: MaxBytesReader's limit maxBodyBytes -> maxBodyBytes+1 (a chunked
// body one byte over was read and granted); ContentLength > maxBodyBytes -> > maxBodyBytes+1
// (100 Continue sent for a body that is then refused).
func TestBodyBoundIsExact(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "payer"}, http.StatusCreated)

	// chunked sends body with no declared length: only the read's own bound can stop it.
	chunked := func(body string) (int, []byte) {
		req, err := http.NewRequestWithContext(f.ctx(), http.MethodPost, f.url+"/admin/users/payer/grants",
			struct{ io.Reader }{strings.NewReader(body)})
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, raw
	}

	if status, _, raw := f.call("POST", "/admin/users/payer/grants", adminToken, paddedGrant(t, "evt_declared_at", bodyBound)); status != http.StatusCreated {
		t.Errorf("grant body of exactly %d bytes, length declared: %d %s, want 201", bodyBound, status, raw)
	}
	if status, raw := chunked(paddedGrant(t, "evt_chunked_at", bodyBound)); status != http.StatusCreated {
		t.Errorf("grant body of exactly %d bytes, chunked: %d %s, want 201", bodyBound, status, raw)
	}
	if status, out, raw := f.call("POST", "/admin/users/payer/grants", adminToken, paddedGrant(t, "evt_declared_over", bodyBound+1)); status != http.StatusRequestEntityTooLarge || errCode(out) != "body_too_large" {
		t.Errorf("grant body of %d bytes, length declared: %d %s, want 413 body_too_large", bodyBound+1, status, raw)
	}
	if status, raw := chunked(paddedGrant(t, "evt_chunked_over", bodyBound+1)); status != http.StatusRequestEntityTooLarge {
		t.Errorf("grant body of %d bytes, chunked: %d %s, want 413", bodyBound+1, status, raw)
	}
	if b := f.admin("GET", "/admin/users/payer/balance", nil, http.StatusOK); b["prepaid"] != json.Number("10") {
		t.Errorf("prepaid %v, want 10: the two grants at the bound, neither over it", b["prepaid"])
	}

	c := f.adminConn(t, fmt.Sprintf("POST /admin/users/payer/grants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"+
		"\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", adminToken, bodyBound+1))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(line, "HTTP/1.1 413") {
		t.Errorf("Content-Length %d with Expect: 100-continue: first line %q, want a 413 before any 100 Continue",
			bodyBound+1, strings.TrimSpace(line))
	}
}
