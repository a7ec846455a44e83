package proxy_test

import (
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// recordingUpstream2 answers every call with a small completion and keeps the headers it was sent.
func recordingUpstream2(extra http.Header) (http.HandlerFunc, func() http.Header) {
	var mu sync.Mutex
	var got http.Header
	return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			mu.Lock()
			got = r.Header.Clone()
			mu.Unlock()
			for k, vv := range extra {
				w.Header()[k] = vv
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, plainAnswer)
		}, func() http.Header {
			mu.Lock()
			defer mu.Unlock()
			return got
		}
}

// The upstream's account identifiers (OpenAI's organisation and project, Anthropic's
// organisation id) describe the operator's provider account, not the caller's answer.
func TestOperatorAccountHeadersNotRelayed(t *testing.T) {
	up, _ := recordingUpstream2(http.Header{
		"Openai-Organization":       {"org-operator-secret-id"},
		"Openai-Project":            {"proj_operator"},
		"Anthropic-Organization-Id": {"11111111-2222-3333-4444-555555555555"},
	})
	h := hostileHarness(t, up, func(c *config.Config) { c.Upstreams[0].APIKey = "sk-operator" })
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	_ = readAll(t, resp.Body)
	resp.Body.Close()
	for _, k := range []string{"Openai-Organization", "Openai-Project", "Anthropic-Organization-Id"} {
		if v := resp.Header.Values(k); len(v) > 0 {
			t.Errorf("operator's upstream account header %s reached the caller: %q", k, v)
		}
	}
}
