package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// A call whose usage never comes (a caller that leaves before it, a provider that sends none)
// is charged its prompt's estimate, and the same estimate bounds its output within the cap:
// every part of a body that the provider reads as prompt must count, or a caller could put
// any amount of prompt there and be charged a few tokens for it. Each test sends 68 000 bytes
// of prompt in one such part and checks the estimate counts at least its 17 000 tokens. A part
// spelt in another case (as a provider decoding with Go's encoding/json reads it) may be
// refused instead (invalid_json, a repeated or unread key): then nothing is estimated at all.

// promptPart is one body whose part bigPrompt stands in; folded: its key is spelt in another
// case, which may be refused rather than counted.
type promptPart struct {
	name, path, body string
	folded           bool
}

// bigPrompt is what each promptPart's body carries in the part under test.
var bigPrompt = strings.Repeat("a long prompt the provider reads. ", 2000) // 68 000 bytes

// checkPromptPartsEstimated sends each part through a gateway whose upstream answers without a
// usage report (lastKeyUpstream), and checks what the call was charged for its prompt.
func checkPromptPartsEstimated(t *testing.T, parts []promptPart) {
	t.Helper()
	h, _ := newLastKeyHarness(t)
	u, key := h.user("standard")
	for _, p := range parts {
		t.Run(p.name, func(t *testing.T) {
			resp := h.post(key, p.path, p.body, nil)
			answer := readAll(t, resp.Body)
			resp.Body.Close()
			if p.folded && resp.StatusCode == http.StatusBadRequest && errorCode(t, answer) == "invalid_json" {
				return // refused: what it would be estimated at is moot
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, answer)
			}
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			if want := int64(len(bigPrompt) / 4); run.InTok < want {
				t.Errorf("charged an estimate of %d input tokens for a prompt of over %d bytes (at least %d tokens at 4 bytes a token; estimated=%v, charged %d µUSD)",
					run.InTok, len(bigPrompt), want, run.Estimated, run.ChargedMicro)
			}
		})
	}
}

// TestPromptEstimateCountsLegacyPromptFields: chat's legacy function calling — function
// definitions in 'functions', an assistant turn's 'function_call' sent back — and a
// completion's 'suffix' are prompt the provider reads and bills as input; so are a system
// prompt, instructions and an output schema spelt in another case, which a provider that folds
// keys reads (such a body is refused).
func TestPromptEstimateCountsLegacyPromptFields(t *testing.T) {
	checkPromptPartsEstimated(t, []promptPart{
		{"functions", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"functions":[{"name":"f","description":"` + bigPrompt + `","parameters":{"type":"object"}}]}`, false},
		{"function_call sent back", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"` + bigPrompt + `"}},{"role":"function","name":"f","content":"ok"}]}`, false},
		{"completion suffix", "/v1/completions",
			`{"model":"fake-gpt","prompt":"hi","suffix":"` + bigPrompt + `"}`, false},
		// In another case: a provider decoding with Go's encoding/json reads them as the above.
		{"Functions", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"Functions":[{"name":"f","description":"` + bigPrompt + `"}]}`, true},
		{"Function_Call", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","Function_Call":{"name":"f","arguments":"` + bigPrompt + `"}}]}`, true},
		{"function_call Arguments", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","function_call":{"name":"f","Arguments":"` + bigPrompt + `"}}]}`, true},
		{"Response_Format", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"Response_Format":{"type":"json_schema","json_schema":{"name":"x","description":"` + bigPrompt + `"}}}`, true},
		{"Instructions", "/v1/responses",
			`{"model":"fake-gpt","input":"hi","Instructions":"` + bigPrompt + `"}`, true},
		{"Text format", "/v1/responses",
			`{"model":"fake-gpt","input":"hi","Text":{"format":{"type":"json_schema","name":"x","schema":{"description":"` + bigPrompt + `"}}}}`, true},
		{"text Format", "/v1/responses",
			`{"model":"fake-gpt","input":"hi","text":{"Format":{"type":"json_schema","name":"x","schema":{"description":"` + bigPrompt + `"}}}}`, true},
		{"System", "/v1/messages",
			`{"model":"claude-test","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"System":"` + bigPrompt + `"}`, true},
		{"Suffix", "/v1/completions",
			`{"model":"fake-gpt","prompt":"hi","Suffix":"` + bigPrompt + `"}`, true},
	})
}

// TestPromptEstimateCountsRefusalsSentBack: an assistant turn sent back with a refusal — chat's
// message-level 'refusal', or a content part of type refusal (chat's, or a Responses
// output message's) — is prompt the provider reads and bills as input. The estimate (the
// charge of a call whose usage never comes, and its output bound within the cap) read only a
// part's 'text', so a caller could put any amount of prompt there and be charged a few tokens.
func TestPromptEstimateCountsRefusalsSentBack(t *testing.T) {
	checkPromptPartsEstimated(t, []promptPart{
		{"chat message refusal", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","refusal":"` + bigPrompt + `"},{"role":"user","content":"please"}]}`, false},
		{"chat refusal part", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"refusal","refusal":"` + bigPrompt + `"}]},{"role":"user","content":"please"}]}`, false},
		{"responses refusal part", "/v1/responses",
			`{"model":"fake-gpt","input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"refusal","refusal":"` + bigPrompt + `"}]},{"role":"user","content":"please"}]}`, false},
		// In another case, as a provider decoding with Go's encoding/json reads it.
		{"chat message Refusal", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","Refusal":"` + bigPrompt + `"}]}`, true},
		{"chat refusal part, Refusal", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"refusal","Refusal":"` + bigPrompt + `"}]}]}`, true},
	})
}

// TestPromptEstimateCountsStoredPromptVariables: a Responses call of a stored prompt (prompt:
// {id, variables}) sends the values of its variables, which the provider puts into the prompt
// and bills as input. The stored prompt's own text is not in the body (a known limit), but the
// variables are: left out of the estimate, a caller that knew one stored prompt's id could send
// any amount of prompt through its variables and, leaving before the usage report, be charged
// a few tokens for it (and its output bound within the cap reckoned without them).
func TestPromptEstimateCountsStoredPromptVariables(t *testing.T) {
	checkPromptPartsEstimated(t, []promptPart{
		{"string variable", "/v1/responses", `{"model":"fake-gpt","prompt":{"id":"pmpt_1","variables":{"doc":"` + bigPrompt + `"}},"input":"hi"}`, false},
		{"input_text variable", "/v1/responses", `{"model":"fake-gpt","prompt":{"id":"pmpt_1","variables":{"doc":{"type":"input_text","text":"` + bigPrompt + `"}}}}`, false},
		// In another case, as a provider decoding with Go's encoding/json reads it.
		{"Variables", "/v1/responses", `{"model":"fake-gpt","prompt":{"id":"pmpt_1","Variables":{"doc":"` + bigPrompt + `"}},"input":"hi"}`, true},
	})
}

// TestPromptEstimateCountsToolLoopParts: what a tool loop sends back — a chat custom tool
// call's input (tool_calls[].custom.input, GPT-5's custom tools), a Responses MCP server's tool
// list (an mcp_list_tools item's tools, which the provider reads instead of listing them
// again) — is prompt the provider bills as input. Left out of the estimate, a caller could put
// any amount of prompt there and, leaving before the usage report, be charged a few tokens.
func TestPromptEstimateCountsToolLoopParts(t *testing.T) {
	checkPromptPartsEstimated(t, []promptPart{
		{"chat custom tool call", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"custom","custom":{"name":"f","input":"` + bigPrompt + `"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`, false},
		{"responses mcp tool list", "/v1/responses",
			`{"model":"fake-gpt","input":[{"type":"mcp_list_tools","id":"mcpl_1","server_label":"s","tools":[{"name":"t","description":"` + bigPrompt + `","input_schema":{"type":"object"}}]},{"role":"user","content":"hi"}]}`, false},
		// In another case, as a provider decoding with Go's encoding/json reads it.
		{"chat custom tool call, Input", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"custom","custom":{"name":"f","Input":"` + bigPrompt + `"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`, true},
		{"chat custom tool call, Custom", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"custom","Custom":{"name":"f","input":"` + bigPrompt + `"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`, true},
		{"responses custom tool call, Input", "/v1/responses",
			`{"model":"fake-gpt","input":[{"role":"user","content":"hi"},{"type":"custom_tool_call","call_id":"c1","name":"f","Input":"` + bigPrompt + `"}]}`, true},
		{"responses mcp tool list, Tools", "/v1/responses",
			`{"model":"fake-gpt","input":[{"type":"mcp_list_tools","id":"mcpl_1","server_label":"s","Tools":[{"name":"t","description":"` + bigPrompt + `"}]},{"role":"user","content":"hi"}]}`, true},
	})
}
