package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestAnswerByAModelWithoutAPartsPriceIsBilledAtTheDearer: the answer may name another model
// than the one asked for, priced on its own (an alias answered by a dated snapshot the operator
// priced apart, a router's pick) but without the price of its own that the call's audio or
// one-hour cache writes need — which the call was admitted for since the model asked for has
// it. That work was billed at the answering model's input, output or five-minute cache-write
// price: audio at a sixteenth of the rate the provider bills it at. Such an answer is billed
// as the context-1m beta's is (TestContext1MAnsweredByAModelWithoutLongPrice): at the dearer
// of its price and the one asked for, never below either.
func TestAnswerByAModelWithoutAPartsPriceIsBilledAtTheDearer(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/messages" {
			fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":1000,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":1000},"output_tokens":10}}`,
				r.Header.Get("X-Answer"))
			return
		}
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1010,"completion_tokens":1010,"total_tokens":2020,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":1000},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":1000}}}`,
			r.Header.Get("X-Answer"))
	}))
	t.Cleanup(up.Close)
	// µUSD per token: text 2.5 in and 10 out; the asked model's audio 40 in and 80 out and its
	// one-hour writes 6.
	const in, out, write, audioIn, audioOut, hour = 2_500_000, 10_000_000, 3_750_000, 40_000_000, 80_000_000, 6_000_000
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "router", Kind: "openai", BaseURL: up.URL, Models: []string{"*"}},
			{Name: "anthropic", Kind: "anthropic", BaseURL: up.URL, Models: []string{"claude*"}}}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
		plain := config.ModelCfg{Input: config.USDPerM{Micro: in}, CacheRead: config.USDPerM{Micro: in},
			CacheWrite: config.USDPerM{Micro: write}, Output: config.USDPerM{Micro: out}}
		priced := plain
		priced.AudioInput, priced.AudioOutput = config.USDPerM{Micro: audioIn}, config.USDPerM{Micro: audioOut}
		priced.CacheWrite1h = config.USDPerM{Micro: hour}
		c.Models["audio-x"], c.Models["audio-x-2025-01-01"] = priced, plain
		c.Models["claude-x"], c.Models["claude-x-20250101"] = priced, plain
	})
	u, key := h.user("standard")
	for _, tc := range []struct {
		name, path, body, answer string
		want                     int64
	}{
		{"audio in and out", "/v1/chat/completions",
			`{"model":"audio-x","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAAAAAA","format":"wav"}}]}]}`,
			"audio-x-2025-01-01", (10*in + 1000*audioIn + 10*out + 1000*audioOut) / 1_000_000},
		{"one-hour cache writes", "/v1/messages",
			`{"model":"claude-x","max_tokens":50,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"hi"}]}`,
			"claude-x-20250101", (10*in + 1000*hour + 10*out) / 1_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, answer := h.answeredRun(u.ID, key, tc.path, tc.body, map[string]string{"X-Answer": tc.answer})
			if r.CostMicro != tc.want {
				t.Errorf("answered by %s: run %+v (answer %s), want cost %d", tc.answer, r, answer, tc.want)
			}
		})
	}
}
