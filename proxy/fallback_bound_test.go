package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestFallbackModelsBoundTheOutputAtTheDearestPrice: a router answers with a fallback of its
// `models` list at that model's rates, and the call is billed at them; the output bound that
// keeps a call's worst case within its cap must then be reckoned at the dearest model the
// router may answer with. Reckoned at the asked model's price, a cheap model falling back to
// one eight times dearer could cost eight times the cap, the charge clamped to the cap and the
// rest paid by the operator.
func TestFallbackModelsBoundTheOutputAtTheDearestPrice(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		m := c.Models["fake-gpt"]
		m.Output = config.USDPerM{Micro: 8 * m.Output.Micro}
		c.Models["dear-gpt"] = m
	})
	_, key := h.user("standard")
	// The default cap, 500 000 µUSD, pays for 50 000 output tokens of fake-gpt (10 µUSD each)
	// and 6 250 of dear-gpt (80 µUSD).
	const capCheap, capDear = 50_000, 6_250
	sent := func(body string) int64 {
		t.Helper()
		resp := h.post(key, "/v1/chat/completions", body, nil)
		b := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return up.last(t).Get("max_tokens").Int()
	}
	if got := sent(`{"model":"fake-gpt","models":["fake-gpt","dear-gpt"],"max_tokens":90000000,"messages":[{"role":"user","content":"hi"}]}`); got > capDear {
		t.Fatalf("upstream got max_tokens=%d with dear-gpt as a fallback: at its price the cap pays for %d", got, capDear)
	}
	if got := sent(`{"model":"fake-gpt","models":["fake-gpt"],"max_tokens":90000000,"messages":[{"role":"user","content":"hi"}]}`); got <= capDear || got > capCheap {
		t.Fatalf("upstream got max_tokens=%d with no dearer fallback, want within (%d, %d]", got, capDear, capCheap)
	}
}

// TestFallbackWithADearerAudioPriceBoundsAudioAtIt: a fallback model bills the audio of a
// prompt at its own audio price, so the output bound must reckon the prompt's audio at that
// price when it is dearer than the asked model's. Reckoned at the asked model's 40 USD/M, a
// fallback billing the clip at 100 USD/M could answer past the cap, the charge clamped to the
// cap and the rest paid by the operator (DESIGN §3: the clamp in step 4 keeps each call's cost
// ≤ its cap). (A fallback without an audio price is refused: TestFallbackWithoutAnOptionsPriceIsRefused.)
func TestFallbackWithADearerAudioPriceBoundsAudioAtIt(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		m := c.Models["fake-gpt"]
		dear := m
		dear.AudioInput = config.USDPerM{Micro: 100_000_000} // 100 USD/M
		c.Models["dear-gpt"] = dear
		m.AudioInput = config.USDPerM{Micro: 40_000_000}
		c.Models["fake-gpt"] = m
	})
	_, key := h.user("standard")
	// A clip whose length cannot be read is estimated at 1 600 tokens: at dear-gpt's 100 µUSD
	// a token, 160 000 µUSD of the 500 000 µUSD cap, leaving at most 34 000 output tokens at
	// 10 µUSD (less the text's share); at the asked model's 40 µUSD, about 43 600.
	const most = (500_000 - 1_600*100) / 10
	resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","models":["fake-gpt","dear-gpt"],"max_tokens":90000000,
		"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAAAAAA","format":"wav"}}]}]}`, nil)
	b := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := up.last(t).Get("max_tokens").Int(); got <= 0 || got > most {
		t.Fatalf("upstream got max_tokens=%d: with dear-gpt billing the clip at 100 USD/M the cap pays for at most %d", got, most)
	}
}
