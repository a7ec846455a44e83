package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
)

// TestMethodNotAllowedNamesTheAllowedMethods: a 405 carries Allow (RFC 9110 requires it), so
// a client or a person with curl learns which method the route takes.
func TestMethodNotAllowedNamesTheAllowedMethods(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodGet, "/v1/chat/completions", "POST"},
		{http.MethodGet, "/v1/messages/count_tokens", "POST"},
		{http.MethodPost, "/v1/credits", "GET, HEAD"},
		{http.MethodDelete, "/v1/runs/r_1", "GET, HEAD"},
		{http.MethodHead, "/v1/chat/completions", "POST"},
		// README "HTTP surface": GET /metrics; a scrape is a GET, and any other method is the
		// wrong one (it was answered 200 with the metrics).
		{http.MethodPost, "/metrics", "GET, HEAD"},
		{http.MethodDelete, "/metrics", "GET, HEAD"},
	} {
		resp, body := sendMethod(t, tc.method, h.gw.URL+tc.path, key, strings.NewReader("{}"))
		// A HEAD answer has no body to carry the error.
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != tc.allow ||
			(tc.method != http.MethodHead && errorCode(t, body) != "method_not_allowed") {
			t.Errorf("%s %s: %d Allow %q %s, want 405 method_not_allowed with Allow %q", tc.method, tc.path, resp.StatusCode,
				resp.Header.Get("Allow"), body, tc.allow)
		}
	}
}

// TestMethodUnknownToTheRouterIsAnsweredAsAnyOther: chi answers a method outside its own list
// (PROPFIND, FOO, the HTTP/2 preface's PRI) 405 before it looks at the path, and the 405
// found the Allow list again by trying GET and POST alone: a path the gateway does not serve
// was 405 with an empty Allow instead of 404, an escaped path (the run name agent%2F1) was 405
// with an empty Allow, and an admin route's PATCH was left out of its Allow.
func TestMethodUnknownToTheRouterIsAnsweredAsAnyOther(t *testing.T) {
	admin := chi.NewRouter()
	admin.Get("/users/{name}", func(http.ResponseWriter, *http.Request) {})
	admin.Patch("/users/{name}", func(http.ResponseWriter, *http.Request) {})
	h := newHarnessOn(t, harnessSetup{admin: admin}, nil)
	_, key := h.user("standard")
	for _, tc := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"FOO", "/v1/chat/completions", http.StatusMethodNotAllowed, "method_not_allowed", "POST"},
		{"PROPFIND", "/v1/credits", http.StatusMethodNotAllowed, "method_not_allowed", "GET, HEAD"},
		{"FOO", "/v1/runs/agent%2F1", http.StatusMethodNotAllowed, "method_not_allowed", "GET, HEAD"},
		{"FOO", "/admin/users/bob", http.StatusMethodNotAllowed, "method_not_allowed", "GET, HEAD, PATCH"},
		{"FOO", "/v1/no-such-route", http.StatusNotFound, "not_found", ""},
		{"FOO", "/", http.StatusNotFound, "not_found", ""},
	} {
		resp, body := sendMethod(t, tc.method, h.gw.URL+tc.path, key, nil)
		allow, named := resp.Header["Allow"]
		if resp.StatusCode != tc.status || errorCode(t, body) != tc.code || strings.Join(allow, ", ") != tc.allow ||
			named != (tc.allow != "") {
			t.Errorf("%s %s: %d Allow %q %s, want %d %s with Allow %q", tc.method, tc.path, resp.StatusCode, allow, body,
				tc.status, tc.code, tc.allow)
		}
	}
}

// TestHeadIsAnsweredLikeGet: HEAD on a GET route was 405, so a load balancer's health check
// that probes with HEAD (HAProxy's httpchk, many monitors) saw a healthy gateway as down. HEAD
// now gets the GET answer's status and headers without its body.
func TestHeadIsAnsweredLikeGet(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, path := range []string{"/healthz", "/readyz", "/v1/models", "/v1/credits"} {
		req, _ := http.NewRequest(http.MethodHead, h.gw.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) != 0 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Errorf("HEAD %s: %d %q body %q, want 200 application/json without a body", path, resp.StatusCode,
				resp.Header.Get("Content-Type"), body)
		}
	}
}

// sendMethod sends a request of any method to url with key, and returns its answer with the
// body read whole (closed).
func sendMethod(t *testing.T, method, url, key string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp, readAll(t, resp.Body)
}
