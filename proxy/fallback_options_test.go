package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestFallbackWithoutAnOptionsPriceIsRefused: a call that asks for work priced apart — audio
// input, a spoken answer, one-hour cache writes — is refused unpriced_option on a model without
// that price, since the provider bills it at rates the price list cannot express (audio at
// several times the text price). A router's fallback (`models`) answers at its own rates: one
// without the price was served and billed the work at its text, output or cache-write price,
// the option checked against the model asked for alone (as the context-1m beta was). Such a
// request is refused as it is when the model asked for lacks the price, before anything is
// held; with every fallback priced for it, it is served.
func TestFallbackWithoutAnOptionsPriceIsRefused(t *testing.T) {
	h := newHarness(t, func(c *configT) {
		plain := c.Models["fake-gpt"]
		priced := plain
		priced.AudioInput = config.USDPerM{Micro: 40_000_000}
		priced.AudioOutput = config.USDPerM{Micro: 80_000_000}
		priced.CacheWrite1h = config.USDPerM{Micro: 2 * plain.Input.Micro}
		c.Models["fake-gpt"], c.Models["priced-too"], c.Models["plain"] = priced, priced, plain
		c.Models["claude-test"], c.Models["claude-priced-too"], c.Models["claude-plain"] = priced, priced, plain
	})
	_, key := h.user("standard")
	const chat, messages = "/v1/chat/completions", "/v1/messages"
	for _, tc := range []struct{ name, path, body string }{
		{"audio input", chat, `{"model":"fake-gpt","models":["fake-gpt","%s"],"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAAAAAA","format":"wav"}}]}]}`},
		{"spoken answer", chat, `{"model":"fake-gpt","models":["fake-gpt","%s"],"modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"messages":[{"role":"user","content":"hi"}]}`},
		{"one-hour cache", messages, `{"model":"claude-test","models":["claude-test","claude-%s"],"max_tokens":50,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, fallbackBody(tc.body, "plain"), nil, http.StatusBadRequest, "unpriced_option")
			resp := h.post(key, tc.path, fallbackBody(tc.body, "priced-too"), nil)
			out := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("every fallback priced for it: %d %s, want 200", resp.StatusCode, out)
			}
		})
	}
}

// fallbackBody is body with its fallback's name (a %s; "claude-%s" on /v1/messages) filled in.
func fallbackBody(body, fallback string) string {
	return fmt.Sprintf(body, fallback)
}
