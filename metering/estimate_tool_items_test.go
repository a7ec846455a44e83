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
