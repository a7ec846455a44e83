package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
)

// TestMislabelledStreamHidesTheUsageChunkNotAskedFor: a stream sent under another content type
// (text/plain, a provider that leaves it to sniffing) is read whole and sent whole, but it is
// still the stream the caller asked for: the usage-only chunk the gateway asked for on its
// behalf (stream_options.include_usage, which the caller did not set) is removed from it, as
// from a stream relayed as it comes. A caller that asked for it gets it.
func TestMislabelledStreamHidesTheUsageChunkNotAskedFor(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n"} {
		t.Run(fmt.Sprintf("eol=%q", eol), func(t *testing.T) { mislabelledUsageChunk(t, eol) })
	}
}

func mislabelledUsageChunk(t *testing.T, eol string) {
	lines := func(s string) string { return strings.ReplaceAll(s, "\n", eol) }
	before := lines(strings.Repeat(hostileChunk, 3))
	after := lines("data: [DONE]\n\n")
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !gjson.GetBytes(body, "stream_options.include_usage").Bool() {
			t.Errorf("the upstream was not asked for the usage chunk: %s", body)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, before+lines(hostileUsage)+after)
	}, nil)
	for _, asked := range []bool{false, true} {
		body := streamBody
		if asked {
			body = `{"model":"fake-gpt","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Stream to the billing team, please."}]}`
		}
		got, run := postAndRun(t, h, body)
		if run.OutTok != 400 {
			t.Errorf("asked=%v: charged output %d, want the 400 reported", asked, run.OutTok)
		}
		if has := bytes.Contains(got, []byte(`"usage":{`)); has != asked {
			t.Errorf("asked for the usage chunk: %v; the caller got it: %v:\n%s", asked, has, got)
		}
		if !asked && string(got) != before+after {
			t.Errorf("the caller got %q, want the stream less the usage chunk %q", got, before+after)
		}
	}
}

// TestMislabelledStreamHidesTheUsageChunkPastAnEventTooLargeToStream: the same stream, and
// before its usage-only chunk an event larger than limits.max_event_bytes. Read whole, every
// event of it is read, as it is metered: the chunk is removed there too, and every other byte,
// the large event included, is relayed as it came. Read with a streamed event's bound, the
// strip stopped at the large event and the caller who had not asked got the chunk.
func TestMislabelledStreamHidesTheUsageChunkPastAnEventTooLargeToStream(t *testing.T) {
	big := "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" +
		strings.Repeat("w", 8<<10) + "\"}}]}\n\n"
	before, after := hostileChunk+big+hostileChunk, "data: [DONE]\n\n"
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, before+hostileUsage+after)
	}, func(c *config.Config) { c.Limits.MaxBodyBytes, c.Limits.MaxEventBytes = 2<<10, 4<<10 })
	got, run := postAndRun(t, h, streamBody)
	if string(got) != before+after {
		t.Errorf("the caller got %d bytes %.200q..., want the stream less its usage chunk, %d bytes, the large event kept",
			len(got), got, len(before+after))
	}
	if run.OutTok != 400 {
		t.Errorf("charged output %d, want the 400 reported", run.OutTok)
	}
}
