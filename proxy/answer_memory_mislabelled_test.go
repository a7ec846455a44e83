package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
)

// TestMislabelledStreamFindingNoRoomIsMeteredByItsEvents: a streamed call answered with its
// event stream under another label (application/json) is read whole; when the answers in
// memory leave it no room it is answered 503 server_busy and charged what it used
// (answerMemoryFull, meterUnrelayed): metered by its events, as the same stream relayed whole
// is — the usage report in its last chunk when it has one, else its prompt's estimate and its
// output's, from the text of its events — not read past as JSON that is no object and charged
// its prompt alone.
func TestMislabelledStreamFindingNoRoomIsMeteredByItsEvents(t *testing.T) {
	const text = "Hello billing team, here is a fairly long answer for you."
	chunk := `data: {"id":"x","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":{"content":"` + text + `"}}]}` + "\n\n"
	const report = `data: {"id":"x","object":"chat.completion.chunk","model":"fake-gpt","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":900,"total_tokens":907}}` + "\n\n"
	const chunks = 50
	up := &fixedUpstream{} // labels every answer application/json
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "fixed", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
	})
	// Refused at once once the room is taken: the wait ends without room either way.
	h.srv.SetAnswerMemoryWait(time.Millisecond)
	seen := metering.EstimateOutputTokens(int64(chunks * len(text)))
	for _, tc := range []struct {
		name      string
		body      string
		estimated bool
		out       int64
	}{
		{"no usage report", strings.Repeat(chunk, chunks) + "data: [DONE]\n\n", true, seen},
		{"usage report", strings.Repeat(chunk, chunks) + report + "data: [DONE]\n\n", false, 900},
	} {
		for _, length := range []bool{false, true} {
			name := fmt.Sprintf("%s (Content-Length %v)", tc.name, length)
			up.set(tc.body, length)
			u, key := h.user("standard")
			status, answer, relayed := h.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
			if status != http.StatusOK {
				t.Fatalf("%s, relayed whole: %d %.200s, want 200", name, status, answer)
			}
			giveBack := h.srv.TakeAnswerMemory()
			status, answer, refused := h.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
			giveBack()
			if status != http.StatusServiceUnavailable || errorCode(t, answer) != "server_busy" {
				t.Fatalf("%s, no room: %d %.200s, want 503 server_busy", name, status, answer)
			}
			for _, run := range []struct {
				how    string
				run    holds.Run
				source string
			}{{"relayed whole", relayed, holds.SourceComplete}, {"no room", refused, holds.SourceStreamError}} {
				r := run.run
				if r.Estimated != tc.estimated || r.OutTok != tc.out || r.SettleSource.String != run.source {
					t.Errorf("%s, %s: settled %s, estimated %v, %d output tokens; want %s, estimated %v, %d",
						name, run.how, r.SettleSource.String, r.Estimated, r.OutTok, run.source, tc.estimated, tc.out)
				}
			}
			if refused.InTok != relayed.InTok || refused.CostMicro != relayed.CostMicro {
				t.Errorf("%s: no room charged %d in, %d micro-USD; relayed whole %d in, %d", name,
					refused.InTok, refused.CostMicro, relayed.InTok, relayed.CostMicro)
			}
		}
	}
}
