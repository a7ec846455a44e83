package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// A stream request answered with the stream labelled text/plain (a Go upstream that forgot its
// Content-Type gets text/plain by sniffing): the usage chunk in it is the provider's report.
func TestHostileStreamMislabelledIsMetered(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for i := 0; i < 5; i++ {
			fmt.Fprint(w, hostileChunk)
		}
		fmt.Fprint(w, hostileUsage)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}, nil)
	body, run := postAndRun(t, h, streamBody)
	if run.OutTok == 0 {
		t.Fatalf("the caller got %d bytes of generated text, charged output 0 (in=%d, estimated=%v)", len(body), run.InTok, run.Estimated)
	}
}

// The converse of TestHostileStreamMislabelledIsMetered: a non-streamed request answered with
// its JSON body labelled text/event-stream. The caller gets the whole answer; it must be charged
// the usage in it, not the prompt's estimate alone.
func TestJSONBodyLabelledEventStreamIsMetered(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello billing team, here is a fairly long answer for you."},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":400,"total_tokens":410}}`)
	}, nil)
	body, run := postAndRun(t, h, chatBody)
	if run.OutTok == 0 {
		t.Fatalf("the caller got the whole answer (%d bytes), charged output 0 (in=%d, estimated=%v)", len(body), run.InTok, run.Estimated)
	}
}

// postAndRun sends body as a new user's chat call and returns what the caller received and
// the call's run.
func postAndRun(t *testing.T, h *harness, body string) ([]byte, holds.Run) {
	t.Helper()
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", body, nil)
	got := readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	t.Logf("status %d, %d bytes to the client; run in=%d out=%d est=%v src=%s charged=%d",
		resp.StatusCode, len(got), run.InTok, run.OutTok, run.Estimated, run.SettleSource.String, run.ChargedMicro)
	return got, run
}
