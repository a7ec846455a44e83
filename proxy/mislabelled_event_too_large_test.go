package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// TestMislabelledStreamIsChargedPastAnEventTooLargeToStream: a stream sent under another content
// type is read whole (up to limits.max_response_bytes) and sent whole, every byte of it, an
// event larger than limits.max_event_bytes and all after it included
// (TestMislabelledStreamHidesTheUsageChunkPastAnEventTooLargeToStream). It must be charged what it
// sends: the provider's report that follows such an event, not the estimate of the events
// before it. Metered with the bound of an event read as it comes, the meter stopped at the
// large event: the caller had the whole answer and its report of 400 output tokens, and was
// charged an estimate of 15 (estimated=1); and a stream whose first event was the large one was
// refused as text that is no API answer, 502 upstream_error charged nothing, for an answer the
// provider made and bills (and an SDK retries a 502, each retry made and charged nothing).
func TestMislabelledStreamIsChargedPastAnEventTooLargeToStream(t *testing.T) {
	big := "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" +
		strings.Repeat("w", 8<<10) + "\"}}]}\n\n"
	for _, tc := range []struct{ name, answer string }{
		{"after other events", hostileChunk + big + hostileUsage + "data: [DONE]\n\n"},
		{"first", big + hostileUsage + "data: [DONE]\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				fmt.Fprint(w, tc.answer)
			}, func(c *config.Config) { c.Limits.MaxBodyBytes, c.Limits.MaxEventBytes = 2<<10, 4<<10 })
			got, run := postAndRun(t, h, `{"model":"fake-gpt","stream":true,"stream_options":{"include_usage":true},`+
				`"messages":[{"role":"user","content":"Stream to the billing team, please."}]}`)
			if string(got) != tc.answer {
				t.Fatalf("the caller got %d bytes %.200q..., want the stream as sent, %d bytes", len(got), got, len(tc.answer))
			}
			if run.SettleSource.String != holds.SourceComplete || run.InTok != 10 || run.OutTok != 400 || run.Estimated {
				t.Errorf("settled %s in=%d out=%d estimated=%v; want complete, charged the report the caller got (10 in, 400 out)",
					run.SettleSource.String, run.InTok, run.OutTok, run.Estimated)
			}
		})
	}
}
