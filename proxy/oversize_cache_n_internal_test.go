package proxy

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// TestMeterOversizedReadsServerCacheN: llama.cpp's server builds of September 2025 to February
// 2026 report the prompt tokens their KV cache held only as timings.cache_n, beside a usage that
// counts the whole prompt. An answer of theirs too large to relay, read past for the report and
// timings at its end, or an array of whole answers to a batch read past answer by answer, had
// those tokens billed at the full input price. Each answer's cache_n is the cached part of its
// prompt, as the same answer read whole has it (metering's taskUsage, taskAnswers).
func TestMeterOversizedReadsServerCacheN(t *testing.T) {
	timings := func(cacheN, completion string) string {
		return `"timings":{"cache_n":` + cacheN + `,"prompt_n":10,"prompt_ms":1.5,"predicted_n":` + completion + `,"predicted_ms":3.1}`
	}
	big := strings.Repeat("a", 300<<10)
	single := `{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"` + big + `"}}],` +
		`"created":1,"model":"m","system_fingerprint":"b6500","object":"chat.completion",` +
		`"usage":{"completion_tokens":75000,"prompt_tokens":90,"total_tokens":75090},"id":"chatcmpl-l",` + timings("80", "75000") + `}`
	element := func(index, text, prompt, cacheN, completion string) string {
		return `{"choices":[{"text":"` + text + `","index":` + index + `,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"m",` +
			`"object":"text_completion","usage":{"completion_tokens":` + completion + `,"prompt_tokens":` + prompt + `,"total_tokens":1},` +
			timings(cacheN, completion) + `,"id":"cmpl-l"}`
	}
	array := "[" + element("0", big, "90", "80", "75000") + "," + element("1", strings.Repeat("b", 200<<10), "210", "200", "50000") + "]"
	for _, tc := range []struct {
		name   string
		format metering.Format
		answer string
		want   pricing.Usage
	}{
		{"single answer", metering.FormatChat, single, pricing.Usage{Input: 10, CacheRead: 80, Output: 75000}},
		{"array of answers", metering.FormatCompletions, array, pricing.Usage{Input: 10 + 10, CacheRead: 80 + 200, Output: 75000 + 50000}},
	} {
		const headLen = 64 << 10
		past := metering.NewMeter(tc.format)
		meterOversized(past, []byte(tc.answer[:headLen]), strings.NewReader(tc.answer[headLen:]), 4<<20)
		whole := metering.NewMeter(tc.format)
		whole.Body([]byte(tc.answer))
		if got, read := past.Result(), whole.Result(); got.Usage != tc.want || read.Usage != tc.want || !got.Reported {
			t.Errorf("%s: read past %+v (reported %v), read whole %+v; want %+v", tc.name, got.Usage, got.Reported, read.Usage, tc.want)
		}
	}
}
