package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

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
		h.postOK(t, key, "/v1/chat/completions", body, nil)
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
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","models":["fake-gpt","dear-gpt"],"max_tokens":90000000,
		"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAAAAAA","format":"wav"}}]}]}`, nil)
	if got := up.last(t).Get("max_tokens").Int(); got <= 0 || got > most {
		t.Fatalf("upstream got max_tokens=%d: with dear-gpt billing the clip at 100 USD/M the cap pays for at most %d", got, most)
	}
}

// TestFallbackWithALargerOutputLimitIsBounded: a call sent without a bound, to a model whose
// own limit its cap pays for, names a fallback with a larger limit. The gateway added no bound,
// and the router, answering with the fallback, wrote to that model's own limit, billed at its
// price: a cap of 500 000 µUSD, 1 000 050 µUSD of output, half of it charged to no one. A bound
// is added where a model that may answer could pass the cap: the asked model's limit, or the
// least limit among them, which no model that may answer refuses.
func TestFallbackWithALargerOutputLimitIsBounded(t *testing.T) {
	var mu sync.Mutex
	var sent gjson.Result
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		sent = gjson.ParseBytes(b)
		mu.Unlock()
		// The router fell back to the last model of the list, which writes to the bound, else
		// to its own limit (unknown-gpt's: 200 000).
		model := gjson.GetBytes(b, "models|@reverse|0").Str
		out := map[string]int64{"big-gpt": 128_000, "small-gpt": 8_192, "unknown-gpt": 200_000}[model]
		if v := gjson.GetBytes(b, "max_tokens"); v.Exists() {
			out = min(out, v.Int())
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"..."},"finish_reason":"length"}],"usage":{"prompt_tokens":20,"completion_tokens":%d}}`, model, out)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "router", Kind: "openai", BaseURL: up.URL, Models: []string{"*"}}}
		m := c.Models["fake-gpt"] // 10 µUSD an output token: the default cap pays for ~50 000
		m.MaxOutputTokens = 16_384
		c.Models["fake-gpt"] = m
		m.MaxOutputTokens = 128_000
		c.Models["big-gpt"] = m // the same price, a larger limit
		m.MaxOutputTokens = 8_192
		c.Models["small-gpt"] = m
		m.MaxOutputTokens = 0
		c.Models["unknown-gpt"] = m // no known limit
	})
	u, key := h.user("standard")
	for _, tc := range []struct {
		name, models string
		bound        int64 // the max_tokens forwarded, 0 for none
	}{
		{"a larger fallback", `["fake-gpt","big-gpt"]`, 16_384},
		{"a larger and a smaller fallback", `["big-gpt","small-gpt"]`, 8_192},
		{"a fallback without a known limit", `["unknown-gpt"]`, 16_384},
		{"fallbacks within the cap", `["small-gpt"]`, 0},
	} {
		r, _ := h.answeredRun(u.ID, key, "/v1/chat/completions",
			`{"model":"fake-gpt","models":`+tc.models+`,"messages":[{"role":"user","content":"write a long story"}]}`, nil)
		mu.Lock()
		got := sent.Get("max_tokens").Int()
		mu.Unlock()
		if got != tc.bound {
			t.Errorf("%s: forwarded max_tokens %d, want %d", tc.name, got, tc.bound)
		}
		if r.CostMicro > r.CapMicro || r.ChargedMicro != r.CostMicro {
			t.Errorf("%s: cost %d µUSD against a cap of %d, charged %d: %d charged to no one",
				tc.name, r.CostMicro, r.CapMicro, r.ChargedMicro, r.CostMicro-r.ChargedMicro)
		}
	}
}
