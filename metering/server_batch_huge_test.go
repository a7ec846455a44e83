package metering

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// TestServerTaskAnswersHugeFiguresSaturate: an array of whole answers (taskAnswers) whose
// figures are past int64 (1e300, 2^63-1; gjson reads both as math.MaxInt64) is summed with
// each figure clamped first, as tokenCount clamps every other report's: summed raw, the second
// answer's figure overflowed the first's, the sum wrapped negative and the batch was billed 0
// prompt and 0 output, where the same figures in one answer are billed pricing.MaxTokens. Read
// past in pieces (an answer too large to relay), it is charged the same.
func TestServerTaskAnswersHugeFiguresSaturate(t *testing.T) {
	answer := func(index, usage string) string {
		return `{"choices":[{"text":"` + strings.Repeat("w", 40) + `","index":` + index + `,"finish_reason":"length"}],"model":"m","object":"text_completion","usage":` + usage + `}`
	}
	for _, usage := range []string{`{"prompt_tokens":1e300,"completion_tokens":9223372036854775807}`,
		`{"prompt_tokens":99999999999999999999,"completion_tokens":1e19}`} {
		body := "[" + answer("0", usage) + "," + answer("1", usage) + "]"
		want := pricing.Usage{Input: pricing.MaxTokens, Output: pricing.MaxTokens}
		whole := NewMeter(FormatCompletions)
		whole.Body([]byte(body))
		if got := whole.Result(); !got.Reported || got.Usage != want {
			t.Errorf("two answers of %s: got %+v (reported %v), want %+v", usage, got.Usage, got.Reported, want)
		}
		m := NewMeter(FormatCompletions)
		ua := m.NewUnrelayedAnswer()
		for b := []byte(body); len(b) > 0; b = b[min(len(b), 7):] {
			ua.Write(b[:min(len(b), 7)])
		}
		m.AddAnswers(ua)
		if got := m.Result(); !got.Reported || got.Usage != want {
			t.Errorf("two answers of %s, read past: got %+v (reported %v), want %+v", usage, got.Usage, got.Reported, want)
		}
	}
}
