package metering

import (
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// TestServerTypedShapesCacheSplit: llama.cpp's server answers /v1/messages (PR 17570, November
// 2025) and /v1/responses (PR 18486, January 2026) in those APIs' own shapes, whole or streamed,
// and never puts its timings (nor their cache_n) beside their usage, as it does on chat and
// completions answers (TestServerCacheNIsReadAsCachedPrompt); its /v1/responses stream has them
// on response.completed from PR 25348 (July 2026), beside the response, long after its usage
// said the cached part itself. Its builds before PR 19361 (February 2026) report the whole
// prompt as input_tokens, with no cached figure: nothing says which of it the KV cache held,
// and it is all input. From PR 19361, a Messages usage gives the cached part as
// cache_read_input_tokens and leaves it out of input_tokens, as Anthropic's API does (the
// Anthropic reading, not subtracted again: a prompt of 90 tokens, 80 of them cached, is input
// 10), and a Responses usage gives it as input_tokens_details.cached_tokens, within
// input_tokens, as OpenAI's does.
func TestServerTypedShapesCacheSplit(t *testing.T) {
	const text = "hello there"
	whole := pricing.Usage{Input: 90, Output: 16}
	split := pricing.Usage{Input: 10, CacheRead: 80, Output: 16}
	messagesStream := func(startUsage string) []string {
		return []string{
			`{"type":"message_start","message":{"id":"chatcmpl-l","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":` + startUsage + `}}`,
			`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + text + `"}}`,
			`{"type":"content_block_stop","index":0}`,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":16}}`,
			`{"type":"message_stop"}`,
		}
	}
	messagesBody := func(usage string) string {
		return `{"id":"chatcmpl-l","type":"message","role":"assistant","content":[{"type":"text","text":"` + text + `"}],"model":"m",` +
			`"stop_reason":"end_turn","stop_sequence":null,"usage":` + usage + `}`
	}
	responsesStream := func(usage, after string) []string {
		return []string{
			`{"type":"response.created","response":{"id":"resp_l","object":"response","status":"in_progress"}}`,
			`{"type":"response.in_progress","response":{"id":"resp_l","object":"response","status":"in_progress"}}`,
			`{"type":"response.output_item.added","item":{"content":[],"id":"msg_l","role":"assistant","status":"in_progress","type":"message"}}`,
			`{"type":"response.content_part.added","item_id":"msg_l","part":{"type":"output_text","text":""}}`,
			`{"type":"response.output_text.delta","item_id":"msg_l","delta":"` + text + `"}`,
			`{"type":"response.output_text.done","item_id":"msg_l","text":"` + text + `"}`,
			`{"type":"response.output_item.done","item":{"type":"message","status":"completed","id":"msg_l","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"` + text + `"}],"role":"assistant"}}`,
			`{"type":"response.completed","response":{"id":"resp_l","object":"response","created_at":1,"status":"completed","model":"m",` +
				`"output":[],"usage":` + usage + `}` + after + `}`,
		}
	}
	responsesBody := func(usage string) string {
		return `{"completed_at":1,"created_at":1,"id":"resp_l","model":"m","object":"response","output":[{"content":[{"type":"output_text",` +
			`"annotations":[],"logprobs":[],"text":"` + text + `"}],"id":"msg_l","role":"assistant","status":"completed","type":"message"}],` +
			`"status":"completed","usage":` + usage + `}`
	}
	const (
		oldMessages  = `{"input_tokens":90,"output_tokens":16}`
		newMessages  = `{"cache_read_input_tokens":80,"input_tokens":10,"output_tokens":16}`
		oldResponses = `{"input_tokens":90,"output_tokens":16,"total_tokens":106}`
		newResponses = `{"input_tokens":90,"output_tokens":16,"total_tokens":106,"input_tokens_details":{"cached_tokens":80}}`
		timings      = `,"timings":{"cache_n":80,"prompt_n":10,"prompt_ms":1.5,"predicted_n":16,"predicted_ms":3.1}`
	)
	for _, tc := range []struct {
		name   string
		format Format
		body   string
		events []string
		want   pricing.Usage
	}{
		{"messages before PR 19361", FormatAnthropic, messagesBody(oldMessages),
			messagesStream(`{"input_tokens":90,"output_tokens":0}`), whole},
		{"messages from PR 19361", FormatAnthropic, messagesBody(newMessages),
			messagesStream(`{"cache_read_input_tokens":80,"input_tokens":10,"output_tokens":0}`), split},
		{"responses before PR 19361", FormatResponses, responsesBody(oldResponses), responsesStream(oldResponses, ""), whole},
		{"responses from PR 19361", FormatResponses, responsesBody(newResponses), responsesStream(newResponses, ""), split},
		{"responses from PR 25348", FormatResponses, responsesBody(newResponses), responsesStream(newResponses, timings), split},
	} {
		m := NewMeter(tc.format)
		m.Body([]byte(tc.body))
		if got := m.Result(); got.Usage != tc.want || !got.Reported || got.Estimated || got.PromptMissing {
			t.Errorf("%s, whole: %+v (reported %v, estimated %v, prompt missing %v), want %+v as reported",
				tc.name, got.Usage, got.Reported, got.Estimated, got.PromptMissing, tc.want)
		}
		m = NewMeter(tc.format)
		for _, ev := range tc.events {
			m.Event(Event{Data: []byte(ev)})
		}
		if got := m.Result(); got.Usage != tc.want || !got.Reported || got.Estimated || got.PromptMissing || got.StartOnly {
			t.Errorf("%s, streamed: %+v (reported %v, estimated %v, prompt missing %v, start only %v), want %+v as reported",
				tc.name, got.Usage, got.Reported, got.Estimated, got.PromptMissing, got.StartOnly, tc.want)
		}
	}
}
