package proxy_test

import (
	"net/http"
	"testing"
)

// TestRouterPriorityTierIsRefusedAsUnpriced: OpenRouter's `:nitro` variant, accepted on any
// model name, sorts its providers by throughput and admits their priority service tier,
// billed at priority rates (about twice the standard) — `service_tier: "priority"` by another
// name, which the gateway refuses. The suffixed name was priced by its prefix, at the
// standard price, asked for or in any router's fallback list (OpenRouter's `models`, LiteLLM's
// `fallbacks`, Vercel's `providerOptions.gateway.models`). And on
// /v1/messages a `service_tier` was never read: Anthropic takes only `auto` and
// `standard_only`, but a router's Anthropic-shaped endpoint serving another provider's model
// reads `priority` or `flex` as on its OpenAI-shaped ones. Both are refused with 400
// unpriced_option before anything is held; Anthropic's own values are served.
func TestRouterPriorityTierIsRefusedAsUnpriced(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	refused := []struct{ name, path, body string }{
		{"chat nitro model", "/v1/chat/completions", `{"model":"fake-gpt:nitro","messages":[{"role":"user","content":"hi"}]}`},
		{"chat nitro in models", "/v1/chat/completions", `{"model":"fake-gpt","models":["fake-gpt","fake-gpt:Nitro"],"messages":[{"role":"user","content":"hi"}]}`},
		{"chat nitro in fallbacks", "/v1/chat/completions", `{"model":"fake-gpt","fallbacks":["fake-gpt:nitro"],"messages":[{"role":"user","content":"hi"}]}`},
		{"chat nitro in Vercel's models", "/v1/chat/completions", `{"model":"fake-gpt","providerOptions":{"gateway":{"models":["fake-gpt:nitro"]}},"messages":[{"role":"user","content":"hi"}]}`},
		{"messages nitro model", "/v1/messages", `{"model":"claude-test:nitro","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`},
		{"messages priority tier", "/v1/messages", `{"model":"claude-test","max_tokens":50,"service_tier":"priority","messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unpriced_option")
		})
	}
	for _, tier := range []string{"auto", "standard_only"} {
		resp := h.post(key, "/v1/messages", `{"model":"claude-test","max_tokens":50,"service_tier":"`+tier+`","messages":[{"role":"user","content":"hi"}]}`, nil)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("service_tier %s: %d %s, want 200: Anthropic's own value", tier, resp.StatusCode, body)
		}
	}
}
