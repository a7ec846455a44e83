package metering

import (
	"strconv"
	"testing"
)

// TestResponsesWholeAnswerCountsWhatItsStreamCounts: a Responses answer read whole without a
// usage report (a non-streamed answer cut partway, or one from a server that reports none) is
// charged the estimate of its output, as a stream of the same answer is: its refusal, its
// reasoning summary and a custom tool's input count, as their deltas do in a stream. Read
// whole, they counted nothing, and such an answer was charged its prompt alone; read in pieces
// (UnrelayedAnswer), the same.
func TestResponsesWholeAnswerCountsWhatItsStreamCounts(t *testing.T) {
	const refusal, summary, input = "I can't help with that request.", "Thinking about the user's request.", "print('hello, world')"
	stream := NewMeter(FormatResponses)
	for _, ev := range []string{
		`{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","output_index":0,"summary_index":0,"delta":"` + summary + `"}`,
		`{"type":"response.refusal.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":"` + refusal + `"}`,
		`{"type":"response.custom_tool_call_input.delta","item_id":"ctc_1","output_index":2,"delta":"` + input + `"}`,
	} {
		stream.Event(Event{Data: []byte(ev)})
	}
	want := stream.Result().OutputChars
	if want != int64(len(refusal)+len(summary)+len(input)) {
		t.Fatalf("the stream counted %d bytes of output, want %d", want, len(refusal)+len(summary)+len(input))
	}
	body := `{"id":"resp_1","object":"response","status":"completed","model":"gpt-test","output":[` +
		`{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"` + summary + `"}]},` +
		`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"refusal","refusal":"` + refusal + `"}]},` +
		`{"id":"ctc_1","type":"custom_tool_call","call_id":"call_1","name":"code_exec","input":"` + input + `"}]}`
	if got := textWhole(FormatResponses, body); got != want {
		t.Errorf("read whole: %d bytes of output, want %d as its stream counts", got, want)
	}
	for _, size := range []int{1, 7, len(body)} {
		if got := textPieces(FormatResponses, body, func() int { return size }); got != want {
			t.Errorf("read in pieces of %d: %d bytes of output, want %d as its stream counts", size, got, want)
		}
	}
}

// TestResponsesWholeAnswerCountsToolCodeAsItsStream: the code a Responses answer's model wrote
// for a tool — a code interpreter's code, a shell's commands, a patch's diff — counts in the
// estimate of its output read whole or in pieces, as their deltas (and a patch delivered whole
// in its output_item.done) count in a stream. Read whole they counted nothing, and an answer
// of tool calls without a usage report was charged its prompt alone.
func TestResponsesWholeAnswerCountsToolCodeAsItsStream(t *testing.T) {
	const code, command, diff = "import math\\nprint(math.pi)", "ls -la /tmp", "@@ -1 +1 @@\\n-a\\n+b"
	stream := NewMeter(FormatResponses)
	for _, ev := range []string{
		`{"type":"response.code_interpreter_call_code.delta","output_index":0,"item_id":"ci_1","delta":"` + code + `"}`,
		`{"type":"response.shell_call_command.delta","output_index":1,"command_index":0,"delta":"` + command + `"}`,
		`{"type":"response.output_item.done","output_index":2,"item":{"type":"apply_patch_call","id":"ap_1","call_id":"c","operation":{"type":"update_file","path":"a","diff":"` + diff + `"}}}`,
	} {
		stream.Event(Event{Data: []byte(ev)})
	}
	want := stream.Result().OutputChars
	if unescaped := int64(len(code) + len(command) + len(diff) - 3); want != unescaped {
		t.Fatalf("the stream counted %d bytes of output, want %d", want, unescaped)
	}
	body := `{"id":"resp_1","object":"response","status":"completed","model":"gpt-test","output":[` +
		`{"id":"ci_1","type":"code_interpreter_call","container_id":"cntr","code":"` + code + `","outputs":[{"type":"logs","logs":"3.14"}]},` +
		`{"id":"sh_1","type":"shell_call","call_id":"c1","action":{"commands":["` + command + `"],"timeout_ms":1000}},` +
		`{"id":"ap_1","type":"apply_patch_call","call_id":"c2","operation":{"type":"update_file","path":"a","diff":"` + diff + `"}}]}`
	if got := textWhole(FormatResponses, body); got != want {
		t.Errorf("read whole: %d bytes of output, want %d as its stream counts", got, want)
	}
	for _, size := range []int{1, 7, len(body)} {
		if got := textPieces(FormatResponses, body, func() int { return size }); got != want {
			t.Errorf("read in pieces of %d: %d bytes of output, want %d as its stream counts", size, got, want)
		}
	}
}

// TestResponsesStreamCountsItemsDeliveredWhole: some items the model writes come in a Responses
// stream whole, in their response.output_item.done, with no deltas before: an MCP tool call that
// waits for approval (mcp_approval_request, its arguments) and a local shell call (its
// action.command). The stream counted neither, where the same answer read whole counted the
// approval's arguments (a local shell's command neither way): a stream cut after them was
// charged less than the same answer cut read whole.
func TestResponsesStreamCountsItemsDeliveredWhole(t *testing.T) {
	const arguments, command0, command1 = `{\"path\":\"/srv/data\"}`, "ls", "-la /srv"
	approval := `{"type":"mcp_approval_request","id":"mcpr_1","server_label":"fs","name":"list","arguments":"` + arguments + `"}`
	shell := `{"type":"local_shell_call","id":"lsh_1","call_id":"c","status":"completed","action":{"type":"exec","command":["` + command0 + `","` + command1 + `"],"env":{}}}`
	stream := NewMeter(FormatResponses)
	for i, item := range []string{approval, shell} {
		stream.Event(Event{Data: []byte(`{"type":"response.output_item.added","output_index":` + strconv.Itoa(i) + `,"item":` + item + `}`)})
		stream.Event(Event{Data: []byte(`{"type":"response.output_item.done","output_index":` + strconv.Itoa(i) + `,"item":` + item + `}`)})
	}
	want := int64(len(arguments) - 4 + len(command0) + len(command1)) // arguments has 4 escapes
	if got := stream.Result().OutputChars; got != want {
		t.Errorf("the stream counted %d bytes of output, want %d", got, want)
	}
	body := `{"id":"resp_1","object":"response","status":"completed","output":[` + approval + `,` + shell + `]}`
	if got := textWhole(FormatResponses, body); got != want {
		t.Errorf("read whole: %d bytes of output, want %d as its stream counts", got, want)
	}
	for _, size := range []int{1, 7, len(body)} {
		if got := textPieces(FormatResponses, body, func() int { return size }); got != want {
			t.Errorf("read in pieces of %d: %d bytes of output, want %d as its stream counts", size, got, want)
		}
	}
}
