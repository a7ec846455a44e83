package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// longPriced is m with a long-context tier past 200 k prompt tokens at twice its input and
// output prices, as Anthropic prices its 1 M context window.
func longPriced(m config.ModelCfg) config.ModelCfg {
	m.LongContext = config.LongContextCfg{AbovePromptTokens: 200_000, Input: config.USDPerM{Micro: 2 * m.Input.Micro},
		CacheRead: m.CacheRead, CacheWrite: m.CacheWrite, Output: config.USDPerM{Micro: 2 * m.Output.Micro}}
	return m
}

// TestContext1MRefusedWithAFallbackWithoutLongPrice: with Anthropic's context-1m beta a prompt
// may pass 200 000 tokens, which the provider bills at its long-context rates. A router's
// fallback (`models`) answers at its own price; one without a long_context price was billed
// such a call at its short rates — half what the provider charged for every token — since the
// beta was checked against the model asked for alone. The request is refused
// (unpriced_option) as it is when the model asked for has no long-context price; a list whose
// models all have one is served, and so is the list without the beta (no prompt passes 200 k).
func TestContext1MRefusedWithAFallbackWithoutLongPrice(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		short := c.Models["fake-gpt"]
		long := longPriced(short)
		c.Models["claude-long"], c.Models["claude-long-too"], c.Models["claude-short"] = long, long, short
	})
	_, key := h.user("standard")
	beta := map[string]string{"Anthropic-Beta": "context-1m-2025-08-07"}
	h.postRefused(t, key, "/v1/messages",
		`{"model":"claude-long","models":["claude-long","claude-short"],"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
		beta, http.StatusBadRequest, "unpriced_option")
	for _, tc := range []struct {
		body string
		hdr  map[string]string
	}{
		{`{"model":"claude-long","models":["claude-long","claude-long-too"],"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, beta},
		{`{"model":"claude-long","models":["claude-long","claude-short"],"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, nil},
	} {
		resp := h.post(key, "/v1/messages", tc.body, tc.hdr)
		out := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s (%v): %d %s, want 200", tc.body, tc.hdr, resp.StatusCode, out)
		}
	}
}

// TestContext1MRefusedOnEveryRoute: the gateway forwards a caller's headers, and a router
// serving Claude on the OpenAI routes passes an anthropic-beta header on to Anthropic (LiteLLM
// does, and forwards an x-pass-anthropic-beta as one; OpenRouter reads x-anthropic-beta). The
// context-1m beta was refused only on /v1/messages and under the header's own name: sent to a
// chat route, or under a prefixed name, a prompt past 200 k on a model without a long-context
// price was billed at its short rates, the provider charging its long ones. It is refused on
// every route, under any name that ends in anthropic-beta; a model with a long-context price
// is served.
func TestContext1MRefusedOnEveryRoute(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		long := longPriced(c.Models["fake-gpt"])
		// Claude served through a router on the OpenAI routes (the harness's "*" upstream).
		c.Models["claude-long"], c.Models["router-claude"], c.Models["router-claude-long"] = long, c.Models["fake-gpt"], long
	})
	_, key := h.user("standard")
	const chat = `{"model":"router-claude%s","messages":[{"role":"user","content":"hi"}]}`
	const messages = `{"model":"claude%s","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct{ path, body, header string }{
		{"/v1/chat/completions", chat, "Anthropic-Beta"},
		{"/v1/responses", `{"model":"router-claude%s","input":"hi"}`, "Anthropic-Beta"},
		{"/v1/chat/completions", chat, "X-Pass-Anthropic-Beta"},
		{"/v1/messages", messages, "X-Anthropic-Beta"},
		{"/v1/messages", messages, "Anthropic-Beta"},
	} {
		hdr := map[string]string{tc.header: "interleaved-thinking-2025-05-14, CONTEXT-1M-2025-08-07"}
		short := "-test"
		if tc.path != "/v1/messages" {
			short = ""
		}
		h.postRefused(t, key, tc.path, fmt.Sprintf(tc.body, short), hdr, http.StatusBadRequest, "unpriced_option")
		resp := h.post(key, tc.path, fmt.Sprintf(tc.body, "-long"), hdr)
		out := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s %s with a long-context price: %d %s, want 200", tc.path, tc.header, resp.StatusCode, out)
		}
	}
}

// TestContext1MInTheBodyRefused: Bedrock takes Anthropic's betas in the body, as
// "anthropic_beta" (InvokeModel) or in "additionalModelRequestFields" (Converse), and a router
// serving Claude from Bedrock passes a body field it does not know on to it (LiteLLM puts
// Converse's unknown parameters in additionalModelRequestFields). The gateway forwards the
// fields it does not read untouched, and looked for the beta in the headers alone: asked for
// in the body, a prompt past 200 k on a model without a long-context price was billed at its
// short rates. It is refused as the header is; a model with a long-context price is served.
func TestContext1MInTheBodyRefused(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		long := longPriced(c.Models["fake-gpt"])
		c.Models["router-claude"], c.Models["router-claude-long"] = c.Models["fake-gpt"], long
	})
	_, key := h.user("standard")
	for _, beta := range []string{
		`"anthropic_beta":["interleaved-thinking-2025-05-14","context-1m-2025-08-07"]`,
		`"anthropic_beta":"context-1m-2025-08-07"`,
		`"additionalModelRequestFields":{"anthropic_beta":["context-1m-2025-08-07"]}`,
	} {
		body := `{"model":"router-claude%s",` + beta + `,"messages":[{"role":"user","content":"hi"}]}`
		h.postRefused(t, key, "/v1/chat/completions", fmt.Sprintf(body, ""), nil, http.StatusBadRequest, "unpriced_option")
		resp := h.post(key, "/v1/chat/completions", fmt.Sprintf(body, "-long"), nil)
		out := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s with a long-context price: %d %s, want 200", beta, resp.StatusCode, out)
		}
	}
}
