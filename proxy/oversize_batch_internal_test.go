package proxy

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering"
)

// TestMeterOversizedChargesEveryPromptOfALlamaBatch: a llama.cpp server's whole answer to a
// completions batch reports its first task alone, its first prompt's; read whole, the other
// prompts are charged at their estimate. The same answer too large to relay is charged so too.
func TestMeterOversizedChargesEveryPromptOfALlamaBatch(t *testing.T) {
	second := strings.Repeat("b", 300<<10)
	answer := `{"choices":[{"text":"aaaa","index":0,"logprobs":null,"finish_reason":"stop"},` +
		`{"text":"` + second + `","index":1,"logprobs":null,"finish_reason":"length"}],` +
		`"created":1,"model":"m","system_fingerprint":"b1","object":"text_completion",` +
		`"usage":{"completion_tokens":2,"prompt_tokens":40,"total_tokens":42},"id":"cmpl-l","timings":{"cache_n":0,"prompt_n":40,"predicted_n":2}}`
	estimates := []int64{30, 200}
	whole := metering.NewMeter(metering.FormatCompletions)
	whole.BatchPrompts(estimates, 1)
	whole.Body([]byte(answer))
	want := whole.Result()
	if want.Usage.Input != 40+200 {
		t.Fatalf("read whole: %+v, want 240 in, the first task's prompt and the second prompt's estimate", want.Usage)
	}
	const headLen = 64 << 10
	past := metering.NewMeter(metering.FormatCompletions)
	past.BatchPrompts(estimates, 1)
	meterOversized(past, []byte(answer[:headLen]), strings.NewReader(answer[headLen:]), 4<<20)
	if got := past.Result(); got.Usage != want.Usage || got.Estimated != want.Estimated {
		t.Errorf("read past, %+v (estimated %v); read whole, %+v (estimated %v)", got.Usage, got.Estimated, want.Usage, want.Estimated)
	}
}
