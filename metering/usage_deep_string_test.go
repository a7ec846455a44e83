package metering

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestCountInAStringOfBracketsIsReadWithoutDeepRecursion: a figure given as a string is read as
// the number it holds (tokenCount), and was first checked for whole JSON by gjson's recursive
// descent, a stack frame per level: a string of brackets as a usage figure grew the stack by
// about 128 bytes for each, and one of 8 MiB (within max_event_bytes, and max_response_bytes)
// took it past Go's 1 GB limit and killed the process, every call in flight with it. A string
// that opens an array or an object is no count, and is not walked. The growth of this
// goroutine's stack is read before it exits, with the collector off (it shrinks stacks).
func TestCountInAStringOfBracketsIsReadWithoutDeepRecursion(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	deep := strings.Repeat("[", 256<<10)
	for _, tc := range []struct {
		name string
		f    Format
		data string
	}{
		{"chat prompt_tokens", FormatChat, `{"choices":[],"usage":{"prompt_tokens":"` + deep + `","completion_tokens":5}}`},
		{"anthropic output_tokens", FormatAnthropic, `{"type":"message_delta","usage":{"output_tokens":" ` + deep + `"}}`},
	} {
		grew := make(chan uint64)
		go func() {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			m := NewMeter(tc.f)
			m.Event(Event{Data: []byte(tc.data)})
			_ = m.Result()
			runtime.ReadMemStats(&after)
			grew <- after.StackInuse - min(after.StackInuse, before.StackInuse)
		}()
		if g := <-grew; g > 4<<20 {
			t.Errorf("%s: reading a figure of %d brackets grew the stacks by %d MiB", tc.name, len(deep), g>>20)
		}
	}
}
