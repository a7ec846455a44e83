package metering

import "github.com/tidwall/gjson"

// responsesEvent handles one OpenAI Responses API event of type typ.
func (m *Meter) responsesEvent(s, typ string) {
	switch typ {
	case "response.created":
		// The model asked for, not yet the one that answers (ModelAsked).
		if keepName(&m.res.Model, gjson.Get(s, "response.model"), false) {
			m.res.ModelAsked = true
		}
		keepName(&m.res.ResponseID, gjson.Get(s, "response.id"), false)
	case "response.completed", "response.incomplete":
		// The finished response names the model that produced it: it overrides the one
		// response.created named (a router's pick is known only at the end).
		if keepName(&m.res.Model, gjson.Get(s, "response.model"), true) {
			m.res.ModelAsked = false
		}
		m.openAIUsage(gjson.Get(s, "response.usage"))
	case "response.failed":
		// A failed response carries what it used so far, and the model that used it, as a
		// completed one does.
		m.res.UpstreamError = true
		if keepName(&m.res.Model, gjson.Get(s, "response.model"), true) {
			m.res.ModelAsked = false
		}
		m.openAIUsage(gjson.Get(s, "response.usage"))
	case "error":
		m.res.UpstreamError = true
	case "response.output_text.delta", "response.refusal.delta", "response.reasoning_text.delta",
		"response.reasoning_summary_text.delta", "response.function_call_arguments.delta",
		"response.custom_tool_call_input.delta", "response.code_interpreter_call_code.delta",
		"response.mcp_call_arguments.delta", "response.shell_call_command.delta":
		// The model's words: its text, reasoning, tool arguments and the commands it writes
		// for the shell tool. (A hosted tool's own output, such as the shell's, is not.)
		m.res.OutputChars += strLen(gjson.Get(s, "delta"))
	case "response.apply_patch_call_operation_diff.delta":
		m.patchDeltas = true
		m.res.OutputChars += strLen(gjson.Get(s, "delta"))
	case "response.output_item.added":
		m.sawItemID(gjson.Get(s, "item.id"))
	case "response.output_item.done":
		m.sawItemID(gjson.Get(s, "item.id"))
		switch gjson.Get(s, "item.type").Str {
		case "apply_patch_call":
			// A patch the model wrote may come whole, in its item, with no deltas before it.
			if !m.patchDeltas {
				m.res.OutputChars += strLen(gjson.Get(s, "item.operation.diff"))
			}
		case "mcp_approval_request":
			// An MCP tool call waiting for approval comes whole, with no deltas before it.
			m.res.OutputChars += strLen(gjson.Get(s, "item.arguments"))
		case "local_shell_call":
			// So does a local shell's command.
			gjson.Get(s, "item.action").Get("command").ForEach(func(_, c gjson.Result) bool {
				m.res.OutputChars += strLen(c)
				return true
			})
		}
	}
}
