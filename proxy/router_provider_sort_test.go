package proxy_test

import (
	"net/http"
	"testing"
)

// TestRouterThroughputSortIsRefusedAsNitro: OpenRouter documents its `:nitro` variant as
// exactly `provider.sort: "throughput"` (the string, or the object form's `by`), which the
// gateway refused by the suffix alone: the same request spelt with the provider preference was
// served at the standard price while the router picks its fastest provider, billed at that
// provider's (priority) rates. Sorting by price (`:floor`'s spelling) picks the cheapest and is
// served, as is a body without a sort. ':exacto', documented as the shortcut for the sort
// "exacto" (providers by tool-calling quality, not price), is refused as ':nitro' is. Vercel AI Gateway's providerOptions.gateway.sort alike:
// "cost" is served, "tps" and "ttft" (the fastest provider first) are refused.
func TestRouterThroughputSortIsRefusedAsNitro(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	refused := []struct{ name, path, body string }{
		{"chat sort throughput", "/v1/chat/completions", `{"model":"fake-gpt","provider":{"sort":"throughput"},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat sort latency", "/v1/chat/completions", `{"model":"fake-gpt","provider":{"sort":"latency"},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat sort object", "/v1/chat/completions", `{"model":"fake-gpt","provider":{"sort":{"by":"throughput","partition":"none"}},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat sort in another case", "/v1/chat/completions", `{"model":"fake-gpt","provider":{"sort":" Throughput"},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat Vercel sort tps", "/v1/chat/completions", `{"model":"fake-gpt","providerOptions":{"gateway":{"sort":"tps"}},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat Vercel sort ttft", "/v1/chat/completions", `{"model":"fake-gpt","providerOptions":{"gateway":{"sort":"ttft"}},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat sort exacto", "/v1/chat/completions", `{"model":"fake-gpt","provider":{"sort":"exacto"},"messages":[{"role":"user","content":"hi"}]}`},
		{"chat exacto model", "/v1/chat/completions", `{"model":"fake-gpt:exacto","messages":[{"role":"user","content":"hi"}]}`},
		{"chat exacto in models", "/v1/chat/completions", `{"model":"fake-gpt","models":["fake-gpt:Exacto"],"messages":[{"role":"user","content":"hi"}]}`},
		{"messages sort throughput", "/v1/messages", `{"model":"claude-test","max_tokens":50,"provider":{"sort":"throughput"},"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unpriced_option")
		})
	}
	for _, options := range []string{`"provider":{"sort":"price"}`, `"provider":{"sort":{"by":"price"}}`, `"provider":{"sort":null}`,
		`"provider":{"order":["a"]}`, `"providerOptions":{"gateway":{"sort":"cost"}}`} {
		resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt",`+options+`,"messages":[{"role":"user","content":"hi"}]}`, nil)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s, want 200: the cheapest provider first, or no sort", options, resp.StatusCode, body)
		}
	}
}
