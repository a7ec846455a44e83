package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestPremiumSpeedAndTiersOnEveryRouteAreRefused: the premium speeds and tiers a router passes
// on beside the OpenAI-shaped body were served at the model's token prices.
//
//   - Anthropic's fast mode (`speed: "fast"`, 2–6× every token) and US-only inference
//     (`inference_geo`, 1.1×) were refused on /v1/messages alone. LiteLLM passes any parameter
//     OpenAI has no name for straight into the provider's body, so on its chat route a Claude
//     model runs in fast mode; OpenRouter documents `speed: "fast"` (beside `service_tier:
//     "fast"`, already refused) as the way to ask its Claude models for fast mode.
//   - Vercel AI Gateway's unified `providerOptions.gateway.speed: "fast"` upgrades the model to
//     its fast serving path, billed at the fast slug's price.
//   - A fast slug (`anthropic/claude-opus-4.6-fast` on OpenRouter, `anthropic/claude-opus-5-fast`
//     on Vercel: the same model at 2–6× its price) named under a configured prefix was priced
//     at the prefix's, as a search variant was before it was refused.
//   - Perplexity's Agent API (Responses-shaped) takes a `preset` (fast-search, pro-search,
//     deep-research) that bundles its web_search and fetch_url tools, billed per call, while
//     the request names a model and no tool: priced at the model's tokens alone.
//   - LiteLLM's Bedrock Converse route takes `performanceConfig` (latency-optimized inference,
//     billed at its own, higher rates) and `serviceTier` (Bedrock's priority tier, at a premium;
//     flex, at a discount) from the body and puts them in the Converse request.
//
// Each is refused 400 unpriced_option before anything is held or forwarded; the standard
// values are served, as is a fast model priced by its own name (the operator's choice).
func TestPremiumSpeedAndTiersOnEveryRouteAreRefused(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Models["fake-gpt-turbo-fast"] = c.Models["fake-gpt"]
	})
	u, key := h.user("standard")
	const chat, responses = "/v1/chat/completions", "/v1/responses"
	refused := []struct{ name, path, body string }{
		{"chat fast mode", chat, `{"model":"fake-gpt","speed":"fast","messages":[{"role":"user","content":"hi"}]}`},
		{"responses fast mode", responses, `{"model":"fake-gpt","speed":"fast","input":"hi"}`},
		{"chat US-only inference", chat, `{"model":"fake-gpt","inference_geo":"us","messages":[{"role":"user","content":"hi"}]}`},
		{"chat Vercel gateway speed", chat, `{"model":"fake-gpt","providerOptions":{"gateway":{"speed":"fast"}},"messages":[{"role":"user","content":"hi"}]}`},
		{"messages Vercel gateway speed", "/v1/messages", `{"model":"claude-test","max_tokens":50,"providerOptions":{"gateway":{"speed":"fast"}},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat fast slug under its prefix", chat, `{"model":"fake-gpt-fast","messages":[{"role":"user","content":"hi"}]}`},
		{"chat fast slug as a fallback", chat, `{"model":"fake-gpt","models":["fake-gpt-4.6-Fast"],"messages":[{"role":"user","content":"hi"}]}`},
		{"chat Bedrock latency-optimized", chat, `{"model":"fake-gpt","performanceConfig":{"latency":"optimized"},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat Bedrock priority tier", chat, `{"model":"fake-gpt","serviceTier":{"type":"priority"},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat Bedrock flex tier", chat, `{"model":"fake-gpt","serviceTier":{"type":"flex"},"messages":[{"role":"user","content":"hi"}]}`},
		{"responses Perplexity preset", responses, `{"model":"fake-gpt","preset":"pro-search","input":"news?"}`},
		{"chat Bedrock tier, key in another case", chat, `{"model":"fake-gpt","ServiceTier":{"type":"priority"},"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			code := "unpriced_option"
			if tc.name == "chat Bedrock tier, key in another case" {
				code = "invalid_json" // a key the gateway reads, spelt in another case
			}
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, code)
		})
	}
	served := []struct{ name, path, body string }{
		{"standard speed", chat, `{"model":"fake-gpt","speed":"standard","messages":[{"role":"user","content":"hi"}]}`},
		{"global inference", chat, `{"model":"fake-gpt","inference_geo":"global","messages":[{"role":"user","content":"hi"}]}`},
		{"Vercel standard speed", chat, `{"model":"fake-gpt","providerOptions":{"gateway":{"speed":"standard"}},"messages":[{"role":"user","content":"hi"}]}`},
		{"Bedrock standard latency", chat, `{"model":"fake-gpt","performanceConfig":{"latency":"standard"},"messages":[{"role":"user","content":"hi"}]}`},
		{"Bedrock default tier", chat, `{"model":"fake-gpt","serviceTier":{"type":"default"},"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range served {
		t.Run("served/"+tc.name, func(t *testing.T) {
			h.postOK(t, key, tc.path, tc.body, nil)
		})
	}
	if status, body := h.get(key, "/v1/models/fake-gpt-fast"); status != http.StatusNotFound {
		t.Errorf("GET /v1/models/fake-gpt-fast: %d %v; want 404, as every call naming it is refused", status, body)
	}
	run, _ := h.answeredRun(u.ID, key, chat, `{"model":"fake-gpt-turbo-fast","messages":[{"role":"user","content":"hi"}]}`, nil)
	if run.CostMicro == 0 {
		t.Errorf("a fast model priced by its own name: settled %+v, want it served and charged", run)
	}
}
