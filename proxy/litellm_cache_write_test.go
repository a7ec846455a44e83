package proxy_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/pricing"
)

// litellmCacheFixtures writes the answers of LiteLLM serving Claude on the chat route, as its
// versions report cache writes: the top-level cache_creation_input_tokens alone (its versions
// from prompt caching's launch until prompt_tokens_details.cache_creation_tokens came), as a
// stream's last chunk; and prompt_tokens_details.cache_creation_tokens with the ttl breakdown
// (later ones), as a body. prompt_tokens counts the writes and the reads in both.
func litellmCacheFixtures(t *testing.T) string {
	dir := routerHourFixtures(t)
	writeFixture(t, dir, "litellm_old.sse", `data: {"id":"chatcmpl-7","created":1741000000,"model":"router-claude","object":"chat.completion.chunk","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":"Python is versatile.","role":"assistant"}}]}

data: {"id":"chatcmpl-7","created":1741000000,"model":"router-claude","object":"chat.completion.chunk","system_fingerprint":null,"choices":[{"finish_reason":"stop","index":0,"delta":{}}]}

data: {"id":"chatcmpl-7","created":1741000000,"model":"router-claude","object":"chat.completion.chunk","system_fingerprint":null,"choices":[],"usage":{"completion_tokens":20,"prompt_tokens":1000,"total_tokens":1020,"completion_tokens_details":null,"prompt_tokens_details":{"audio_tokens":null,"cached_tokens":100},"cache_creation_input_tokens":600,"cache_read_input_tokens":100}}

data: [DONE]

`)
	writeFixture(t, dir, "litellm_details.json", `{"id":"chatcmpl-8","created":1760000000,"model":"router-claude","object":"chat.completion",
"choices":[{"finish_reason":"stop","index":0,"message":{"content":"Python is versatile.","role":"assistant"}}],
"usage":{"completion_tokens":20,"prompt_tokens":1000,"total_tokens":1020,
"prompt_tokens_details":{"cached_tokens":100,"text_tokens":300,"cache_creation_tokens":600,
"cache_creation_token_details":{"ephemeral_5m_input_tokens":200,"ephemeral_1h_input_tokens":400}},
"cache_creation_input_tokens":600,"cache_read_input_tokens":100}}`)
	return dir
}

// TestLiteLLMCacheWritesBilledAsWrites: LiteLLM's cache writes, under the names its versions
// give them (not OpenAI's cache_write_tokens, which only its latest add), are charged at the
// cache-write price, the one-hour part at the one-hour one; read as plain input, the 600
// writes of each answer were charged at the input price (the one-hour ones at half what
// Anthropic bills). Its latest usage, every name at once, still counts them once.
func TestLiteLLMCacheWritesBilledAsWrites(t *testing.T) {
	h := newHarnessWithFixtures(t, litellmCacheFixtures(t), routerHourPrices)
	price := routerClaudePrice(t, h)
	u, key := h.user("standard")
	hour := `{"type":"ephemeral","ttl":"1h"}`
	for _, tc := range []struct {
		name, fixture, cacheControl string
		want                        pricing.Usage
	}{
		{"top-level only, streamed", "litellm_old.sse", `{"type":"ephemeral"}`,
			pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, Output: 20}},
		{"top-level only, an hour asked", "litellm_old.sse", hour,
			pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, CacheWrite1h: 600, Output: 20}},
		{"details with the ttl breakdown", "litellm_details.json", hour,
			pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, CacheWrite1h: 400, Output: 20}},
		{"every name at once", "litellm_cache.json", hour,
			pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, CacheWrite1h: 400, Output: 20}},
	} {
		body := routerCacheBody("router-claude", tc.cacheControl)
		if tc.fixture == "litellm_old.sse" {
			body = body[:len(body)-1] + `,"stream":true,"stream_options":{"include_usage":true}}`
		}
		run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderReplay: tc.fixture})
		if run.Usage() != tc.want || run.Estimated {
			t.Errorf("%s: settled with %+v (estimated %v), want %+v", tc.name, run.Usage(), run.Estimated, tc.want)
		}
		if want := price.Cost(tc.want); run.CostMicro != want || run.ChargedMicro != want {
			asInput := price.Cost(pricing.Usage{Input: 900, CacheRead: 100, Output: 20})
			t.Errorf("%s: cost %d charged %d, want %d (the writes read as input: %d)", tc.name, run.CostMicro, run.ChargedMicro, want, asInput)
		}
	}
}
