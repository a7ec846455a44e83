package proxy_test

import (
	"net/http"
	"testing"
)

// TestRouterServerToolsAreRefused: OpenRouter runs tools of its own, named with an
// "openrouter:" type in "tools" on every route it serves — a web search billed per result, an
// image generation at image rates, a fetch, a shell — and on its chat route takes the hosted
// tools' OpenAI names ("web_search", "web_search_preview") as its web search. The gateway
// billed them at the model's token prices, the fees falling on the operator. They are refused
// with 400 unpriced_option before anything is held; a function tool is served.
func TestRouterServerToolsAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, tc := range []struct{ name, path, body string }{
		{"chat, openrouter web search", "/v1/chat/completions", `{"model":"fake-gpt","tools":[{"type":"openrouter:web_search"}],"messages":[{"role":"user","content":"hi"}]}`},
		{"chat, openrouter image generation", "/v1/chat/completions", `{"model":"fake-gpt","tools":[{"type":"function","function":{"name":"f","parameters":{}}},{"type":"OpenRouter:image_generation"}],"messages":[{"role":"user","content":"hi"}]}`},
		{"chat, web search by its OpenAI name", "/v1/chat/completions", `{"model":"fake-gpt","tools":[{"type":"web_search_preview"}],"messages":[{"role":"user","content":"hi"}]}`},
		{"responses, openrouter web fetch", "/v1/responses", `{"model":"fake-gpt","tools":[{"type":"openrouter:web_fetch"}],"input":"hi"}`},
		{"messages, openrouter web search", "/v1/messages", `{"model":"claude-test","max_tokens":50,"tools":[{"type":"openrouter:web_search"}],"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unpriced_option")
		})
	}
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","tools":[{"type":"function","function":{"name":"web_search","parameters":{}}}],"messages":[{"role":"user","content":"hi"}]}`, nil) // a function tool
}
