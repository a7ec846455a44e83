package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
)

// TestUpstreamQuotesInLogsHoldNoKeyAndAreBounded: every log field that quotes what an upstream
// sent or a transport error of a call to it — an error answer's body, the head of a 200 that
// is no answer and its Content-Type, a 200's error object, the model an answer names, a stream's error event, the
// provider's request id, the transport's words for a malformed status line (which quote the
// line) — holds no spelling of the upstream's key (as sent, as a JSON encoder escapes its /,
// as a URL quotes it) nor any part of it, and is at most 512 bytes, its cut marked. The
// upstream echoes the key it was sent in each, 2 KiB long and past the 512th byte too. The
// transport's words were logged whole, key and all, and the escaped spellings were not looked
// for.
func TestUpstreamQuotesInLogsHoldNoKeyAndAreBounded(t *testing.T) {
	const opKey = "opsecret/0123456789+abcdefXYZ"
	escaped := strings.ReplaceAll(opKey, "/", `\/`)
	pad := strings.Repeat("p", 2048)
	hostile := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		if key == "" {
			key = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		// Quoted at its start, escaped, and straddling the 512th byte.
		echo := key + " " + escaped + " " + strings.Repeat("s", 470) + key + pad
		w.Header().Set("X-Request-Id", escaped+pad)
		switch r.Header.Get("X-Hostile-Mode") {
		case "400", "500", "401":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(map[string]int{"400": 400, "500": 500, "401": 401}[r.Header.Get("X-Hostile-Mode")])
			fmt.Fprintf(w, `{"type":"error","error":{"type":"invalid_request_error","message":"%s"}}`, echo)
		case "page":
			w.Header().Set("Content-Type", "text/html; note="+escaped+pad)
			fmt.Fprintf(w, "<html><body>%s</body></html>", echo)
		case "error object":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"error":{"type":%q,"message":%q}}`, echo, echo)
		case "answered":
			// A model name is kept up to 256 bytes (longer is none): the key, bounded anyway.
			echo = key + "-" + escaped
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, echo)
		case "stream error":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: %s\ndata: {\"type\":\"error\",\"error\":{\"type\":%q,\"message\":%q}}\n\n", strings.ReplaceAll(echo, " ", "-"), echo, echo)
		case "malformed":
			// A status line without a space: the transport's error quotes it.
			conn, bw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			fmt.Fprintf(bw, "%s\r\n\r\n", strings.ReplaceAll(echo, " ", "-"))
			bw.Flush()
		}
	}))
	t.Cleanup(hostile.Close)
	core, logs := observer.New(zapcore.DebugLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, func(c *config.Config) {
		for i := range c.Upstreams {
			c.Upstreams[i].BaseURL, c.Upstreams[i].APIKey = hostile.URL, opKey
		}
	})
	_, key := h.user("standard")
	const chat = `{"model":"fake-gpt","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	const stream = `{"model":"fake-gpt","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	const count = `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct{ mode, path, body string }{
		{"400", "/v1/chat/completions", chat},
		{"500", "/v1/chat/completions", chat},
		{"401", "/v1/chat/completions", chat},
		{"page", "/v1/chat/completions", chat},
		{"error object", "/v1/chat/completions", chat},
		{"answered", "/v1/chat/completions", chat},
		{"stream error", "/v1/chat/completions", stream},
		{"malformed", "/v1/chat/completions", chat},
		{"malformed", "/v1/messages/count_tokens", count},
		{"500", "/v1/messages/count_tokens", count},
	} {
		before := len(logs.All())
		resp := h.post("", tc.path, tc.body, map[string]string{"X-Api-Key": key, "Authorization": "Bearer " + key, "X-Hostile-Mode": tc.mode})
		readAll(t, resp.Body)
		resp.Body.Close()
		h.settled()
		quoted := false
		for _, e := range logs.All()[before:] {
			for k, v := range e.ContextMap() {
				s, ok := v.(string)
				if !ok {
					continue
				}
				if strings.Contains(s, opKey[:5]) {
					t.Errorf("%s %s: line %q, field %s holds the operator's key or part of it: %.300q", tc.mode, tc.path, e.Message, k, s)
				}
				if len(s) > 512 {
					t.Errorf("%s %s: line %q, field %s quotes %d bytes, want at most 512", tc.mode, tc.path, e.Message, k, len(s))
				}
				// Every answer has its request id: a line of the case's own must quote it.
				quoted = quoted || (k != "upstream_request_id" && strings.Contains(s, "(redacted)"))
			}
		}
		if !quoted {
			// The test tests nothing if no line quoted the upstream.
			t.Errorf("%s %s: no log line quoted the upstream's echo", tc.mode, tc.path)
		}
	}
}
