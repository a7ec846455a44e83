package metering_test

import (
	"testing"

	"github.com/tollgate/tollgate/metering"
)

// TestEstimateMeasuresANumberWhereTextGoesAsGjsonFormatsIt: a number where the estimate reads
// text (a message's or a part's refusal, a part's text, a function call's arguments) counts
// as gjson's String() formats it, as the estimate has always counted it: 1e20 is
// "100000000000000000000", 21 bytes, not the 4 of its JSON. Measured by its JSON when the
// members came to be read raw (ef58cbf), such a prompt was estimated below what it had been.
func TestEstimateMeasuresANumberWhereTextGoesAsGjsonFormatsIt(t *testing.T) {
	// 21 bytes: 6 tokens, and the message's 4.
	const want = 10
	for _, c := range []struct {
		name string
		f    metering.Format
		body string
	}{
		{"chat refusal", metering.FormatChat, `{"messages":[{"role":"assistant","refusal":1e20}]}`},
		{"part text", metering.FormatChat, `{"messages":[{"role":"user","content":[{"type":"text","text":1e20}]}]}`},
		{"part refusal", metering.FormatChat, `{"messages":[{"role":"assistant","content":[{"type":"refusal","refusal":1e20}]}]}`},
		{"responses arguments", metering.FormatResponses, `{"input":[{"type":"function_call","arguments":1e20}]}`},
		{"anthropic part text", metering.FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"text","text":1e20}]}]}`},
	} {
		if got, _ := metering.EstimatePrompt(c.f, []byte(c.body)); got != want {
			t.Errorf("%s: estimated %d tokens, want %d", c.name, got, want)
		}
	}
}
