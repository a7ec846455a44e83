package proxy_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// TestOneHourCacheWritesTheFinalDeltaDoesNotSplit: a /v1/messages stream whose prompt is cached
// for an hour and whose server tool (web_fetch, tokens only) runs several turns on Anthropic's
// side: message_start breaks its writes down by ttl, and message_delta gives the whole call's
// larger count with no breakdown (as in the shared fixture
// anthropic_messages_stream_cache_write_then_delta_overrides.sse). The writes message_start had
// not counted were billed at the five-minute price, for a request that asked for none: every
// write no report says was a five-minute one is billed at the one-hour price, as the
// OpenAI-shaped routes bill a total without a breakdown.
func TestOneHourCacheWritesTheFinalDeltaDoesNotSplit(t *testing.T) {
	dir := t.TempDir()
	const fixture = "anthropic_one_hour_then_total.sse"
	stream := "event: message_start\n" +
		`data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2,"cache_creation_input_tokens":3068,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":3068},"output_tokens":1}}}` + "\n\n" +
		"event: content_block_start\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
		"event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Fetched."}}` + "\n\n" +
		"event: content_block_stop\n" + `data: {"type":"content_block_stop","index":0}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":6,"cache_creation_input_tokens":3337,"cache_read_input_tokens":6289,"output_tokens":198,"server_tool_use":{"web_search_requests":0,"web_fetch_requests":1}}}` + "\n\n" +
		"event: message_stop\n" + `data: {"type":"message_stop"}` + "\n\n"
	if err := os.WriteFile(filepath.Join(dir, fixture), []byte(stream), 0o600); err != nil {
		t.Fatal(err)
	}
	h, price := harnessRepricing(t, dir, "claude-test", func(m *config.ModelCfg) {
		m.CacheWrite1h = config.USDPerM{Micro: 2 * m.Input.Micro}
	})
	u, key := h.user("standard")
	resp, _ := h.postOK(t, key, "/v1/messages", `{"model":"claude-test","max_tokens":400,"stream":true,
		"tools":[{"type":"web_fetch_20250910","name":"web_fetch","max_uses":1}],
		"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral","ttl":"1h"}}],
		"messages":[{"role":"user","content":"summarise https://example.com"}]}`, map[string]string{fakellm.HeaderReplay: fixture})
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	used := pricing.Usage{Input: 6, CacheRead: 6289, CacheWrite: 3337, CacheWrite1h: 3337, Output: 198}
	if want := price.Cost(used); run.CostMicro != want || run.ChargedMicro != want || run.CacheWrite1hTok != 3337 {
		t.Fatalf("cost %d charged %d cache_write_1h_tok %d; want %d and 3337: none of the writes was said to be a five-minute one",
			run.CostMicro, run.ChargedMicro, run.CacheWrite1hTok, want)
	}
}
