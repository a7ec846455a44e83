package proxy_test

import (
	"net/http"
	"testing"
)

// TestRouterFallbackChainsOutsideModelsAreChecked: routers take fallback models in places the
// gateway did not look. Helicone's AI gateway reads a comma-separated model name
// ("cheap,dear") as a chain it falls back along; the name was priced by its prefix, the
// first model's, and served. Vercel's AI Gateway reads `providerOptions.gateway.models`, a
// list like OpenRouter's `models`, never price-checked. Either let a caller ask for a cheap
// model and be answered, at the router's rates, by a dear or unpriced one, its output bound
// reckoned at the cheap price. The chained name is refused 400 invalid_model; Vercel's list
// is checked as `models` is (an unpriced name refused unpriced_option, priced ones served).
func TestRouterFallbackChainsOutsideModelsAreChecked(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	h.postRefused(t, key, "/v1/chat/completions", `{"model":"fake-gpt,unpriced-dear","messages":[{"role":"user","content":"hi"}]}`,
		nil, http.StatusBadRequest, "invalid_model")
	h.postRefused(t, key, "/v1/messages", `{"model":"claude-test,unpriced-dear","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
		nil, http.StatusBadRequest, "invalid_model")
	h.postRefused(t, key, "/v1/chat/completions", `{"model":"fake-gpt","providerOptions":{"gateway":{"models":["unpriced-dear"]}},"messages":[{"role":"user","content":"hi"}]}`,
		nil, http.StatusBadRequest, "unpriced_option")
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","providerOptions":{"gateway":{"models":["claude-test"]}},"messages":[{"role":"user","content":"hi"}]}`, nil) // a priced fallback
}
