package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestServerCacheNIsChargedAtTheCacheReadPrice: llama.cpp's server builds of September 2025 (PR
// 15827) to February 2026 (PR 19361) report the prompt tokens reused from their KV cache only as
// timings.cache_n, beside a usage whose prompt_tokens counts the whole prompt. The gateway read
// no cache figure: a prompt of 90 tokens, 80 of them from the cache, was charged 90 input
// tokens at fake-gpt's input price, 100 µUSD over its cost at the cache-read price. Whole,
// streamed, and a /v1/completions batch answered as an array of whole answers (each answer its
// own prompt's task), the cache_n of each task is charged at the cache-read price.
func TestServerCacheNIsChargedAtTheCacheReadPrice(t *testing.T) {
	usage := func(prompt, cacheN int64) string {
		return fmt.Sprintf(`"usage":{"completion_tokens":16,"prompt_tokens":%d,"total_tokens":%d},`+
			`"timings":{"cache_n":%d,"prompt_n":%d,"prompt_ms":1.5,"predicted_n":16,"predicted_ms":3.1}`, prompt, prompt+16, cacheN, prompt-cacheN)
	}
	text := strings.Repeat("w", 64)
	chat := `{"model":"fake-gpt","max_tokens":16,"messages":[{"role":"user","content":"` + strings.Repeat("x", 360) + `"}]%s}`
	element := func(index int, prompt, cacheN int64) string {
		return fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"fake-gpt",`+
			`"system_fingerprint":"b6500","object":"text_completion",%s,"id":"cmpl-l"}`, text, index, usage(prompt, cacheN))
	}
	for _, tc := range []struct {
		name, path, request, answer string
		stream, estimated           bool
		want                        pricing.Usage
	}{
		{"whole chat answer", "/v1/chat/completions", fmt.Sprintf(chat, ""),
			`{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"` + text + `"}}],"created":1,"model":"fake-gpt",` +
				`"system_fingerprint":"b6500","object":"chat.completion",` + usage(90, 80) + `,"id":"chatcmpl-l"}`,
			false, false, pricing.Usage{Input: 10, CacheRead: 80, Output: 16}},
		{"streamed chat answer", "/v1/chat/completions", fmt.Sprintf(chat, `,"stream":true`),
			`data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"` + text + `"}}],"created":1,"id":"chatcmpl-l","model":"fake-gpt","object":"chat.completion.chunk"}` + "\n\n" +
				`data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1,"id":"chatcmpl-l","model":"fake-gpt","object":"chat.completion.chunk"}` + "\n\n" +
				`data: {"choices":[],"created":1,"id":"chatcmpl-l","model":"fake-gpt","object":"chat.completion.chunk",` + usage(90, 80) + "}\n\ndata: [DONE]\n\n",
			true, false, pricing.Usage{Input: 10, CacheRead: 80, Output: 16}},
		{"batch answered as an array", "/v1/completions",
			`{"model":"fake-gpt","max_tokens":16,"prompt":["` + strings.Repeat("x", 400) + `","` + strings.Repeat("y", 800) + `"]}`,
			"[" + element(0, 90, 80) + "," + element(1, 210, 200) + "]",
			false, true, pricing.Usage{Input: 10 + 10, CacheRead: 80 + 200, Output: 16 + 16}},
	} {
		h := fixedAnswerHarness(t, tc.stream, tc.answer)
		model := h.cfg.Models["fake-gpt"]
		price := pricing.Price{Input: model.Input.Micro, CacheRead: model.CacheRead.Micro, CacheWrite: model.CacheWrite.Micro, Output: model.Output.Micro}
		u, key := h.user("standard")
		status, _, run := h.postRun(u.ID, key, tc.path, tc.request, nil)
		if status != http.StatusOK {
			t.Fatalf("%s: status %d", tc.name, status)
		}
		cost := price.Cost(tc.want)
		if run.SettleSource.String != holds.SourceComplete || run.InTok != tc.want.Input || run.CacheReadTok != tc.want.CacheRead ||
			run.OutTok != tc.want.Output || run.Estimated != tc.estimated || run.CostMicro != cost || run.ChargedMicro != cost {
			t.Errorf("%s: run settled by %q in=%d cache_read=%d out=%d estimated=%v cost=%d charged=%d µUSD; want complete, %+v, estimated %v, %d µUSD",
				tc.name, run.SettleSource.String, run.InTok, run.CacheReadTok, run.OutTok, run.Estimated, run.CostMicro, run.ChargedMicro, tc.want, tc.estimated, cost)
		}
	}
}
