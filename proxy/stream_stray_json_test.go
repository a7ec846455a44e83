package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestStrayJSONLineInAStreamIsNoReport: a stream whose events carry data answers as a stream.
// A later line of bare JSON in it — no field, so no event of the caller's SSE parser — is no
// usage report: the call is charged the report its events carried. Read as the answer's own
// body (as a JSON answer sent whole under the event-stream label is, before any event carried
// data), its "usage" replaced the stream's.
func TestStrayJSONLineInAStreamIsNoReport(t *testing.T) {
	h := fixedAnswerHarness(t, true, hostileChunk+hostileUsage+
		`{"usage":{"prompt_tokens":10,"completion_tokens":90000,"total_tokens":90010}}`+"\n\n"+"data: [DONE]\n\n")
	u, key := h.user("standard")
	status, _, run := h.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
	if status != http.StatusOK || run.SettleSource.String != holds.SourceComplete || run.OutTok != 400 {
		t.Errorf("%d, settled %s with %d output tokens, want 200 complete with the 400 its usage chunk reported",
			status, run.SettleSource.String, run.OutTok)
	}
}
