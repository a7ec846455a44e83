package proxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestMethodNotAllowedNamesTheAllowedMethods: a 405 carries Allow (RFC 9110 requires it), so
// a client or a person with curl learns which method the route takes.
func TestMethodNotAllowedNamesTheAllowedMethods(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodGet, "/v1/chat/completions", "POST"},
		{http.MethodGet, "/v1/messages/count_tokens", "POST"},
		{http.MethodPost, "/v1/credits", "GET"},
		{http.MethodDelete, "/v1/runs/r_1", "GET"},
	} {
		req, _ := http.NewRequest(tc.method, h.gw.URL+tc.path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != tc.allow || errorCode(t, body) != "method_not_allowed" {
			t.Errorf("%s %s: %d Allow %q %s, want 405 method_not_allowed with Allow %q", tc.method, tc.path, resp.StatusCode,
				resp.Header.Get("Allow"), body, tc.allow)
		}
	}
}
