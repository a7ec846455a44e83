package metering_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering"
)

// TestEstimateResponsesToolLoopItems: a Responses tool loop sends back what the model wrote
// and what its tools gave, each of which the provider bills as input: a computer-use
// screenshot (computer_call_output's output, an object, not a list of parts), a custom tool's
// call (its input, a string) and a shell's commands and output (stdout and stderr, not text
// parts), and a patch the model wrote (apply_patch_call's operation.diff). Estimated at nothing,
// a computer-use loop of screenshots was estimated at a few tokens: a caller that left before
// response.completed was charged that, and the output bound before forwarding let the cap be
// passed by the prompt's whole cost.
func TestEstimateResponsesToolLoopItems(t *testing.T) {
	text := strings.Repeat("x", 400) // 100 tokens
	for _, tc := range []struct {
		name, item string
		want       int64 // tokens, its message's 4 included
	}{
		{"computer screenshot", `{"type":"computer_call_output","call_id":"c","output":{"type":"computer_screenshot","image_url":"data:image/png;base64,AAAA"}}`, 1600 + 4},
		// Its type read with case folded, as a provider decoding with Go's encoding/json reads
		// it (and as a part's is): read as spelt, the screenshot was estimated at nothing.
		{"computer screenshot typed in another case", `{"type":"computer_call_output","call_id":"c","output":{"Type":"computer_screenshot","image_url":"data:image/png;base64,AAAA"}}`, 1600 + 4},
		{"custom tool call", `{"type":"custom_tool_call","call_id":"c","name":"code","input":"` + text + `"}`, 100 + 4},
		{"shell call", `{"type":"shell_call","call_id":"c","action":{"commands":["` + text + `"]}}`, 100 + 4},
		{"shell output", `{"type":"shell_call_output","call_id":"c","output":[{"stdout":"` + text[:200] + `","stderr":"` + text[:200] + `","outcome":{"type":"exit","exit_code":0}}]}`, 100 + 4},
		{"patch", `{"type":"apply_patch_call","call_id":"c","operation":{"type":"update_file","path":"a","diff":"` + text + `"}}`, 100 + 4},
		{"function output", `{"type":"function_call_output","call_id":"c","output":"` + text + `"}`, 100 + 4},
	} {
		body := `{"model":"m","input":[` + tc.item + `]}`
		if got, _ := metering.EstimatePrompt(metering.FormatResponses, []byte(body)); got != tc.want {
			t.Errorf("%s: estimated %d tokens, want %d", tc.name, got, tc.want)
		}
	}
}

// TestEstimateResponsesHostedToolItems: a Responses input that sends back what a hosted tool
// did — a compaction (the whole context before it, encrypted), a code interpreter's call (its
// code and its logs), a file search (its queries and the text of the chunks it found) — is
// billed it as input: the model reads it. Not read, each was estimated at its message's 4
// tokens. The compaction's encrypted content is opaque: its bytes stand for its tokens, as an
// Anthropic redacted_thinking block's data's do.
func TestEstimateResponsesHostedToolItems(t *testing.T) {
	text := strings.Repeat("x", 400) // 100 tokens
	for _, tc := range []struct {
		name, item string
		want       int64 // tokens, its message's 4 included
	}{
		{"compaction", `{"type":"compaction","id":"cmp_1","encrypted_content":"` + text + `"}`, 100 + 4},
		{"code interpreter", `{"type":"code_interpreter_call","id":"ci","container_id":"c","code":"` + text[:200] + `",` +
			`"outputs":[{"type":"logs","logs":"` + text[:200] + `"}],"status":"completed"}`, 100 + 4},
		{"file search", `{"type":"file_search_call","id":"fs","queries":["` + text[:200] + `"],"status":"completed",` +
			`"results":[{"file_id":"f","filename":"a.txt","score":0.9,"text":"` + text[:200] + `"}]}`, 100 + 4},
	} {
		body := `{"model":"m","input":[` + tc.item + `]}`
		if got, _ := metering.EstimatePrompt(metering.FormatResponses, []byte(body)); got != tc.want {
			t.Errorf("%s: estimated %d tokens, want %d", tc.name, got, tc.want)
		}
	}
}
