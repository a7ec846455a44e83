package proxy_test

import (
	"net/http"
	"testing"
)

// TestRouterRetryAndTimeoutFieldsAreRefused: LiteLLM's proxy reads per-request timeouts and
// retries from the body (`timeout`, `request_timeout`, `stream_timeout`, `num_retries`,
// `max_retries`), and its other fallback lists (`context_window_fallbacks`,
// `content_policy_fallbacks`, maps of a model to the models it falls back to). Forwarded, a
// caller set the router to give up on the call after the provider had it — a non-2xx,
// charged 0 here, the provider billing what it did — or to run it several times, billed once;
// and to fall back to a model whose price was never checked (`fallbacks` and `models` are).
// They are refused with 400 unsupported_parameter before anything is held; null (the field
// unset, as clients that write every optional field send it) is served.
func TestRouterRetryAndTimeoutFieldsAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	refused := []struct{ name, path, body string }{
		{"timeout", "/v1/chat/completions", `{"model":"fake-gpt","timeout":0.01,"messages":[{"role":"user","content":"hi"}]}`},
		{"request_timeout", "/v1/chat/completions", `{"model":"fake-gpt","request_timeout":"1","messages":[{"role":"user","content":"hi"}]}`},
		{"stream_timeout", "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"stream_timeout":0.01,"messages":[{"role":"user","content":"hi"}]}`},
		{"num_retries", "/v1/chat/completions", `{"model":"fake-gpt","num_retries":10,"messages":[{"role":"user","content":"hi"}]}`},
		{"max_retries", "/v1/completions", `{"model":"fake-gpt","max_retries":10,"prompt":"hi"}`},
		{"messages timeout", "/v1/messages", `{"model":"claude-test","max_tokens":50,"timeout":1,"messages":[{"role":"user","content":"hi"}]}`},
		{"responses retries", "/v1/responses", `{"model":"fake-gpt","num_retries":3,"input":"hi"}`},
		{"context_window_fallbacks", "/v1/chat/completions", `{"model":"fake-gpt","context_window_fallbacks":[{"fake-gpt":["unpriced-dear"]}],"messages":[{"role":"user","content":"hi"}]}`},
		{"content_policy_fallbacks", "/v1/chat/completions", `{"model":"fake-gpt","content_policy_fallbacks":[{"fake-gpt":["unpriced-dear"]}],"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unsupported_parameter")
		})
	}
	resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","timeout":null,"num_retries":null,"messages":[{"role":"user","content":"hi"}]}`, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s, want 200: the fields set to null", resp.StatusCode, body)
	}
}
