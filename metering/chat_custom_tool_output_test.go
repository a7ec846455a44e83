package metering

import "testing"

// TestChatAnswerCountsACustomToolsInput: a chat answer that calls a custom tool carries what
// the model wrote for it in tool_calls[].custom.input (not function.arguments), output the
// provider bills. Neither a stream nor a whole answer (read whole or in pieces) counted it,
// and an answer of custom tool calls without a usage report was charged its prompt alone.
func TestChatAnswerCountsACustomToolsInput(t *testing.T) {
	const input = "SELECT name FROM users WHERE id = 42"
	stream := NewMeter(FormatChat)
	stream.Event(Event{Data: []byte(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[` +
		`{"index":0,"id":"call_1","type":"custom","custom":{"name":"sql","input":"` + input + `"}}]}}]}`)})
	if got := stream.Result().OutputChars; got != int64(len(input)) {
		t.Errorf("the stream counted %d bytes of output, want %d", got, len(input))
	}
	body := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[` +
		`{"id":"call_1","type":"custom","custom":{"name":"sql","input":"` + input + `"}}]},"finish_reason":"tool_calls"}]}`
	if got := textWhole(FormatChat, body); got != int64(len(input)) {
		t.Errorf("read whole: %d bytes of output, want %d", got, len(input))
	}
	for _, size := range []int{1, 7, len(body)} {
		if got := textPieces(FormatChat, body, func() int { return size }); got != int64(len(input)) {
			t.Errorf("read in pieces of %d: %d bytes of output, want %d", size, got, len(input))
		}
	}
}
