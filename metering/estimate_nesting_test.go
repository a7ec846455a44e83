package metering

import (
	"strings"
	"testing"
	"time"
)

// TestInputEstimateOfDeepNestingIsCheap: the input estimate runs on every request before
// anything is held. Content nested deep (arrays in arrays, tool_result blocks in tool_result
// content) must not cost time quadratic in the body: a 600 KB body took half a minute of CPU,
// a 4 MB one (the default max_body_bytes) tens of minutes, for any caller with a key.
func TestInputEstimateOfDeepNestingIsCheap(t *testing.T) {
	const d = 50_000 // tool_result levels; arrays nest 3×d deep
	for _, tc := range []struct {
		name string
		f    Format
		body string
	}{
		{"nested arrays", FormatChat, `{"model":"m","messages":[{"role":"user","content":` + strings.Repeat("[", 3*d) + strings.Repeat("]", 3*d) + `}]}`},
		{"nested tool_result", FormatAnthropic, `{"model":"m","messages":[{"role":"user","content":` + strings.Repeat(`[{"type":"tool_result","content":`, d) + `"x"` + strings.Repeat("}]", d) + `}]}`},
	} {
		done := make(chan time.Duration, 1)
		go func() {
			t0 := time.Now()
			EstimateInputTokens(tc.f, []byte(tc.body))
			done <- time.Since(t0)
		}()
		select {
		case took := <-done:
			t.Logf("%s, %d bytes: %v", tc.name, len(tc.body), took)
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: estimating the input of a %d-byte body still runs after 3 s", tc.name, len(tc.body))
		}
	}
}
