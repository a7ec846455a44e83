package metering

import "testing"

// TestAnthropicWholeAnswerCountsWhatItsStreamCounts: an Anthropic message read whole without a
// usage report (a non-streamed answer cut partway, or one from a server that reports none) is
// charged the estimate of its output, as a stream of the same answer is: the summary of a
// compaction block counts, as its compaction_delta does in a stream. Read whole or in pieces
// (UnrelayedAnswer) it counted nothing, and a compacting call was charged its text alone. A
// server tool's result block (an MCP tool's, whose content may be a string) is no output of
// the model, in a stream or whole.
func TestAnthropicWholeAnswerCountsWhatItsStreamCounts(t *testing.T) {
	const summary, text = "The user asked for a refactor of the billing module; done so far: ...", "Continuing."
	stream := NewMeter(FormatAnthropic)
	for _, ev := range []string{
		`{"type":"content_block_start","index":0,"content_block":{"type":"compaction","content":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"compaction_delta","content":"` + summary + `"}}`,
		`{"type":"content_block_start","index":1,"content_block":{"type":"mcp_tool_result","tool_use_id":"t","is_error":false,"content":"tool said so"}}`,
		`{"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":"` + text + `"}}`,
	} {
		stream.Event(Event{Data: []byte(ev)})
	}
	want := stream.Result().OutputChars
	if want != int64(len(summary)+len(text)) {
		t.Fatalf("the stream counted %d bytes of output, want %d", want, len(summary)+len(text))
	}
	for name, body := range map[string]string{
		"type first": `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[` +
			`{"type":"compaction","content":"` + summary + `"},` +
			`{"type":"mcp_tool_result","tool_use_id":"t","is_error":false,"content":"tool said so"},` +
			`{"type":"text","text":"` + text + `"}]}`,
		"content first": `{"content":[{"content":"` + summary + `","type":"compaction"},` +
			`{"content":"tool said so","type":"mcp_tool_result"},{"content":{"a":"b"},"type":"compaction"},{"text":"` + text + `"}]}`,
	} {
		if got := textWhole(FormatAnthropic, body); got != want {
			t.Errorf("%s, read whole: %d bytes of output, want %d as its stream counts", name, got, want)
		}
		for _, size := range []int{1, 7, len(body)} {
			if got := textPieces(FormatAnthropic, body, func() int { return size }); got != want {
				t.Errorf("%s, read in pieces of %d: %d bytes of output, want %d as its stream counts", name, size, got, want)
			}
		}
	}
}
