package proxy_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// A close-delimited stream whose upstream dies inside an event reads, to the transport, as a
// clean end. The gateway sees the half event is cut JSON (it does not meter it): the caller
// must be told the stream broke, as after any break — the whole events, then an
// upstream_broken error event, never the half event and a clean end, which an SDK that drops
// an unfinished event at the end (the OpenAI Node SDK) takes for the whole answer — and the
// call ends as the broken stream it is (stream_error), not complete.
func TestHostileStreamCutInsideAnEventIsABreak(t *testing.T) {
	whole := strings.Repeat(hostileChunk, 3)
	h := hostileHarness(t, closeDelimited(t, "text/event-stream", whole+hostileChunk[:40]), nil)
	u, key := h.user("standard")
	status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
	if status != 200 {
		t.Fatalf("status %d: %s", status, answer)
	}
	rest, ok := strings.CutPrefix(string(answer), whole)
	if !ok || !strings.HasPrefix(rest, "data: {\"error\":") || !strings.Contains(rest, `"code":"upstream_broken"`) ||
		!strings.HasSuffix(rest, "}\n\n") || strings.Count(rest, "\n\n") != 1 {
		t.Fatalf("caller got %q\nwant the whole events, then one upstream_broken error event", answer)
	}
	if run.SettleSource.String != holds.SourceStreamError || !run.Estimated || run.OutTok == 0 {
		t.Fatalf("run settled by %q out=%d estimated=%v, want stream_error charged the estimate of the text streamed",
			run.SettleSource.String, run.OutTok, run.Estimated)
	}
}
