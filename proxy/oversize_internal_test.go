package proxy

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering"
)

// TestLastUsageFindsTheReportAtTheEnd: the usage of an answer too large to relay is read from
// its end, in a whole body or an event stream, never from text that quotes the word.
func TestLastUsageFindsTheReportAtTheEnd(t *testing.T) {
	for _, tc := range []struct{ name, tail, want string }{
		{"body", `...ing"}}],"usage":{"prompt_tokens":3,"completion_tokens":9},"service_tier":"default"}`, `{"prompt_tokens":3,"completion_tokens":9}`},
		{"spaces", `"usage" : {"prompt_tokens":3} }`, `{"prompt_tokens":3}`},
		{"event stream", "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n", `{"prompt_tokens":3}`},
		{"quoted in text only", `"transcript":"the \"usage\":{\"prompt_tokens\":1} field"}}]}`, ``},
		{"null", `"usage":null}`, ``},
		{"cut inside", `"usage":{"prompt_tokens":3,"compl`, ``},
		{"none", `{"choices":[]}`, ``},
	} {
		if got := lastUsage([]byte(tc.tail)); got.Raw != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got.Raw, tc.want)
		}
	}
}

// TestMeterOversizedReadsAtMostItsBound: an answer that never ends is read up to the bound and
// no further.
func TestMeterOversizedReadsAtMostItsBound(t *testing.T) {
	endless := strings.NewReader(strings.Repeat("x", 10<<20))
	m := metering.NewMeter(metering.FormatChat)
	if read := meterOversized(m, []byte(`{"model":"m"`), endless, 1<<20); read != 1<<20 {
		t.Fatalf("read %d bytes, want the bound, %d", read, 1<<20)
	}
	if m.Result().Reported {
		t.Fatal("a usage was found in bytes that hold none")
	}
	m = metering.NewMeter(metering.FormatChat)
	rest := strings.Repeat("y", 600<<10) + `"}}],"usage":{"prompt_tokens":3,"completion_tokens":9}}`
	meterOversized(m, []byte(`{"id":"x","model":"gpt-4o","choices":[{"message":{"content":"`), strings.NewReader(rest), 4<<20)
	if r := m.Result(); !r.Reported || r.Usage.Input != 3 || r.Usage.Output != 9 || r.Model != "gpt-4o" {
		t.Fatalf("result %+v, want the usage at the end and the model at the head", r)
	}
}
