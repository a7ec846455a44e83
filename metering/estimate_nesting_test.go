package metering

import (
	"strings"
	"testing"
)

// deepBodies nest content d levels deep: arrays in arrays, tool_result blocks in
// tool_result content, and blocks as a block's content (web_fetch_tool_result's). Following
// every level costs time quadratic in the body (each level's parse scans everything below it):
// a 600 KB body took half a minute of CPU before the depth bound, and the estimate runs on
// every request before anything is held.
func deepBodies(d int) []struct {
	name string
	f    Format
	body string
} {
	return []struct {
		name string
		f    Format
		body string
	}{
		{"nested arrays", FormatChat, `{"model":"m","messages":[{"role":"user","content":` + strings.Repeat("[", d) + `"xxxx"` + strings.Repeat("]", d) + `}]}`},
		{"nested tool_result", FormatAnthropic, `{"model":"m","messages":[{"role":"user","content":` + strings.Repeat(`[{"type":"tool_result","content":`, d) + `"xxxx"` + strings.Repeat("}]", d) + `}]}`},
		{"nested content objects", FormatAnthropic, `{"model":"m","messages":[{"role":"user","content":[` + strings.Repeat(`{"type":"x","content":`, d) + `"xxxx"` + strings.Repeat("}", d) + `]}]}`},
	}
}

// TestInputEstimateStopsDescendingAtItsDepthBound: content nested deeper than maxContentDepth
// is counted by its raw size instead of being followed level by level — what keeps the
// estimate linear in the body (BenchmarkInputEstimateDeepNesting shows the time). Shallow
// content is still counted by its text.
func TestInputEstimateStopsDescendingAtItsDepthBound(t *testing.T) {
	for _, tc := range deepBodies(maxContentDepth - 1) {
		// Within the bound: the 4 bytes of text (one token) plus the message overhead.
		if got := EstimateInputTokens(tc.f, []byte(tc.body)); got > 10 {
			t.Errorf("%s nested %d deep: estimate %d tokens, want the text's", tc.name, maxContentDepth-1, got)
		}
	}
	for _, tc := range deepBodies(2_000) {
		// Past the bound: the nested value's raw size, thousands of bytes of brackets.
		if got := EstimateInputTokens(tc.f, []byte(tc.body)); got < 500 {
			t.Errorf("%s nested 2000 deep: estimate %d tokens, want it counted by its raw size", tc.name, got)
		}
	}
}

func BenchmarkInputEstimateDeepNesting(b *testing.B) {
	for _, tc := range deepBodies(50_000) {
		b.Run(strings.ReplaceAll(tc.name, " ", "_"), func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			for b.Loop() {
				EstimateInputTokens(tc.f, []byte(tc.body))
			}
		})
	}
}
