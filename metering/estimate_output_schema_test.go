package metering_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering"
)

// TestEstimateCountsTheOutputSchemaInEveryFormat: a structured-output request's schema is part
// of the prompt its provider counts (Anthropic adds a system prompt explaining the format), and
// the estimate counts it on the chat (response_format) and Responses (text.format) routes. On
// /v1/messages the schema is output_config.format (output_format under the structured-outputs
// beta): left out there, a call charged its estimate (a stream cut before message_start, a
// timeout) or whose output bound was fitted to its cap by it, was reckoned without a schema that
// may run to thousands of tokens.
func TestEstimateCountsTheOutputSchemaInEveryFormat(t *testing.T) {
	props := make([]string, 0, 200)
	for i := range 200 {
		props = append(props, `"field_`+strings.Repeat("x", i%7)+`_`+string(rune('a'+i%26))+`":{"type":"string","description":"one of the fields of the record"}`)
	}
	schema := `{"type":"object","properties":{` + strings.Join(props, ",") + `},"additionalProperties":false}`
	const msgs = `"messages":[{"role":"user","content":"extract the record"}]`
	least := int64(len(schema)) / 4 // the estimate's 4 bytes per token
	for _, tc := range []struct {
		name   string
		format metering.Format
		body   string
		base   string
	}{
		{"chat response_format", metering.FormatChat,
			`{` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":` + schema + `}}}`, `{` + msgs + `}`},
		{"responses text.format", metering.FormatResponses,
			`{"input":"extract the record","text":{"format":{"type":"json_schema","name":"r","schema":` + schema + `}}}`, `{"input":"extract the record"}`},
		{"anthropic output_config.format", metering.FormatAnthropic,
			`{` + msgs + `,"output_config":{"format":{"type":"json_schema","schema":` + schema + `}}}`, `{` + msgs + `}`},
		{"anthropic beta output_format", metering.FormatAnthropic,
			`{` + msgs + `,"output_format":{"type":"json_schema","schema":` + schema + `}}`, `{` + msgs + `}`},
	} {
		without, _ := metering.EstimatePrompt(tc.format, []byte(tc.base))
		with, _ := metering.EstimatePrompt(tc.format, []byte(tc.body))
		if with-without < least {
			t.Errorf("%s: the schema (%d bytes) added %d tokens to the estimate, want at least %d", tc.name, len(schema), with-without, least)
		}
	}
}
