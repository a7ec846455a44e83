package proxy_test

import (
	"fmt"
	"net/http"
	"testing"
)

// A 200 whose body is text that is neither JSON nor an event stream — a proxy's or CDN's
// maintenance page that does not open with a tag, an Envoy "upstream connect error" — is no
// model's answer, as a web page is not: 502 upstream_error, charged nothing. It was relayed as
// a 200 the SDKs cannot parse (they raise) and charged the prompt's estimate, on every call
// and every SDK retry for as long as the page stood there.
func TestPlainTextAnswerIsNoAnswer(t *testing.T) {
	for _, tc := range []struct{ name, ctype, body string }{
		{"html without a tag first", "text/html; charset=utf-8", "Service temporarily unavailable"},
		{"envoy text", "text/plain", "upstream connect error or disconnect/reset before headers. reset reason: connection termination"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				fmt.Fprint(w, tc.body)
			}, nil)
			u, key := h.user("standard")
			status, body, run := h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
			if status != http.StatusBadGateway || errorCode(t, body) != "upstream_error" {
				t.Errorf("%d %s, want 502 upstream_error", status, body)
			}
			if run.ChargedMicro != 0 || run.SettleSource.String != "upstream_error" {
				t.Errorf("charged %d (%s, estimated %v), want 0 (upstream_error)", run.ChargedMicro, run.SettleSource.String, run.Estimated)
			}
		})
	}
}
