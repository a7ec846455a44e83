package main

import (
	"net/http"
	"os"
	"strings"
	"testing"
)

// TestServerRefusalsAreThoseREADMESaysArePlainText: README § Errors says every error has
// OpenAI's (or on /v1/messages Anthropic's) JSON shape, and names the answers Go's HTTP server
// writes itself before any handler runs — 400 for a request it cannot parse (two different
// Content-Lengths among them), 431 for headers past 64 KiB, 501 for a Transfer-Encoding other
// than chunked, 505 for a request line naming another HTTP version, 417 for an Expect other than
// 100-continue. Those are plain text, or no body at all for the 417 (net/http writes them; no
// handler, so no JSON, no X-Tollgate-Request-Id and no metric), and README must say so where it
// promises the shape, or a caller or an alert keyed on error.code looks for a body that never
// comes.
func TestServerRefusalsAreThoseREADMESaysArePlainText(t *testing.T) {
	addr := serveBounded(t)
	for _, tc := range []struct {
		name, request string
		status        int
		empty         bool // no body, and so no Content-Type
	}{
		{"two Content-Lengths", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello", http.StatusBadRequest, false},
		{"a request line that is no HTTP", "GARBAGE\r\n\r\n", http.StatusBadRequest, false},
		{"headers past 64 KiB", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: " + strings.Repeat("a", 72<<10) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge, false},
		{"another Transfer-Encoding", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", http.StatusNotImplemented, false},
		{"another HTTP version", "POST /v1/chat/completions HTTP/2.0\r\nHost: x\r\n\r\n", http.StatusHTTPVersionNotSupported, false},
		{"an Expect other than 100-continue", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nContent-Length: 2\r\n\r\n{}", http.StatusExpectationFailed, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, addr, tc.request)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if tc.empty {
				if len(body) != 0 || resp.Header.Get("Content-Type") != "" {
					t.Errorf("Content-Type %q body %q: the server's own refusal now has a body; README § Errors says it has none", resp.Header.Get("Content-Type"), body)
				}
			} else if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type %q (body %q): the server's own refusal is no longer plain text; README § Errors says it is", ct, body)
			}
		})
	}

	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	start := strings.Index(readme, "\n### Errors\n")
	if start < 0 {
		t.Fatal("README has no ### Errors section")
	}
	intro := readme[start:]
	if end := strings.Index(intro, "\n| status |"); end >= 0 {
		intro = intro[:end]
	}
	for _, want := range []string{"plain text", "431", "501", "505", "417"} {
		if !strings.Contains(intro, want) {
			t.Errorf("README § Errors' introduction promises every error in JSON and does not name the HTTP server's own plain-text refusals (%q missing)", want)
		}
	}
}
