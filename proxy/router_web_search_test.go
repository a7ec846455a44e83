package proxy_test

import (
	"net/http"
	"testing"
)

// TestRouterWebSearchIsRefusedAsUnpriced: OpenRouter runs a web search for a request carrying
// its web plugin (`plugins: [{"id": "web"}]`) or naming a model with the `:online` suffix (the
// same plugin), and bills each result it fetches ($4 a thousand; Anthropic's native search for
// Claude at $10 a thousand searches) on top of the tokens. Forwarded, such a call was charged
// the model's token prices alone (the suffixed name priced by its prefix), and the fee fell on
// the operator. It is refused with 400 unpriced_option, on the Anthropic route as on the
// OpenAI-shaped ones, as Anthropic's own web_search tool is; other plugins are served.
func TestRouterWebSearchIsRefusedAsUnpriced(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	refused := []struct{ name, path, body string }{
		{"messages web plugin", "/v1/messages",
			`{"model":"claude-test","max_tokens":50,"plugins":[{"id":"web","max_results":5}],"messages":[{"role":"user","content":"hi"}]}`},
		{"messages online model", "/v1/messages",
			`{"model":"claude-test:online","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`},
		{"chat web plugin", "/v1/chat/completions",
			`{"model":"fake-gpt","plugins":[{"id":"response-healing"},{"id":"web"}],"messages":[{"role":"user","content":"hi"}]}`},
		{"chat online model", "/v1/chat/completions",
			`{"model":"fake-gpt:online","messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unpriced_option")
		})
	}
	h.postOK(t, key, "/v1/messages", `{"model":"claude-test","max_tokens":50,"plugins":[{"id":"response-healing"}],"messages":[{"role":"user","content":"hi"}]}`, nil) // a plugin without a fee
}
