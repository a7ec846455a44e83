package proxy_test

import (
	"net/http"
	"testing"
)

// TestExtraBodyIsRefused: a body's own "extra_body" object is merged by LiteLLM into the
// provider's request (its keys that the request does not set already: safe_merge_extra_body,
// or the OpenAI SDK's extra_body, which LiteLLM hands it), so every option the gateway refuses
// at the top level reached the provider from inside it, unread: a service_tier of priority,
// Anthropic's fast mode, a hosted web search, a router's fallbacks, each billed at the model's
// token prices. (The SDKs send their own extra_body merged into the body: a literal
// "extra_body" key is no client's option but a router's.) It is refused 400 unpriced_option on
// every route, before anything is held; null or an empty object, which adds nothing, is served.
func TestExtraBodyIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	const chat, responses = "/v1/chat/completions", "/v1/responses"
	refused := []struct{ name, path, body string }{
		{"chat priority tier", chat, `{"model":"fake-gpt","extra_body":{"service_tier":"priority"},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat fast mode", chat, `{"model":"fake-gpt","extra_body":{"speed":"fast"},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat hosted web search", chat, `{"model":"fake-gpt","extra_body":{"web_search_options":{}},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat unpriced fallback", chat, `{"model":"fake-gpt","extra_body":{"fallbacks":["gpt-unpriced"]},"messages":[{"role":"user","content":"hi"}]}`},
		{"responses hosted tool", responses, `{"model":"fake-gpt","extra_body":{"tools":[{"type":"web_search"}]},"input":"news?"}`},
		{"messages fast mode", "/v1/messages", `{"model":"claude-test","max_tokens":50,"extra_body":{"speed":"fast"},"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unpriced_option")
		})
	}
	for _, body := range []string{
		`{"model":"fake-gpt","extra_body":null,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"fake-gpt","extra_body":{},"messages":[{"role":"user","content":"hi"}]}`,
	} {
		resp := h.post(key, chat, body, nil)
		got := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d %s, want 200: it adds nothing to the request", body, resp.StatusCode, got)
		}
	}
}
