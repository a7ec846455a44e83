package metering_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering"
)

// TestEstimateCountsLegacyFunctionCalling: chat's function calling before tools — "functions"
// (the definitions) and an assistant message's "function_call" (its arguments), which OpenAI
// still serves and bills as prompt tokens, as the SDKs still send them — is estimated as the
// same definitions and calls are under "tools" and "tool_calls". Left out, a call charged its
// estimate (a stream cut before its usage), or whose output bound was fitted to its cap by it,
// was reckoned without its function definitions and the arguments sent back.
func TestEstimateCountsLegacyFunctionCalling(t *testing.T) {
	params := `{"type":"object","properties":{"city":{"type":"string","description":"` + strings.Repeat("the name of the city ", 100) + `"}}}`
	args := `{"city":"` + strings.Repeat("Paris ", 200) + `"}`
	const user = `{"role":"user","content":"weather?"}`
	tools := `{"messages":[` + user + `,{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":` + jsonString(args) + `}}]}],` +
		`"tools":[{"type":"function","function":{"name":"weather","parameters":` + params + `}}]}`
	legacy := `{"messages":[` + user + `,{"role":"assistant","content":null,"function_call":{"name":"weather","arguments":` + jsonString(args) + `}}],` +
		`"functions":[{"name":"weather","parameters":` + params + `}]}`
	bare := `{"messages":[` + user + `,{"role":"assistant","content":null}]}`
	base, _ := metering.EstimatePrompt(metering.FormatChat, []byte(bare))
	withTools, _ := metering.EstimatePrompt(metering.FormatChat, []byte(tools))
	withLegacy, _ := metering.EstimatePrompt(metering.FormatChat, []byte(legacy))
	least := int64(len(params)+len(args)) / 4
	if withTools-base < least {
		t.Fatalf("tools: the definitions and arguments added %d tokens, want at least %d", withTools-base, least)
	}
	if withLegacy-base < least {
		t.Errorf("functions and function_call: the definitions and arguments added %d tokens, want at least %d (tools: %d)",
			withLegacy-base, least, withTools-base)
	}
}

// jsonString quotes s as a JSON string.
func jsonString(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }
