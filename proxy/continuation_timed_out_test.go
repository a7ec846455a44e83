package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestContinuedResponseChainThroughATimedOutAnswer: a Responses call answered (unasked) as a
// stream that named its answer (response.created) and then ran past upstream_timeout is billed
// by the provider, which carries its context into a continuation of it: recorded as its
// estimate, as an answer its caller left is. Recording nothing for it, the next call of the
// chain, cut before its usage, was estimated from its new turn alone and the 50 000 tokens of
// context the chain carries went uncharged.
func TestContinuedResponseChainThroughATimedOutAnswer(t *testing.T) {
	created := func(w http.ResponseWriter, id string) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%q,\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n", id)
		fmt.Fprintf(w, "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":{\"id\":%q,\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n", id)
		w.(http.Flusher).Flush()
	}
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		body := readAll(t, r.Body)
		switch {
		case strings.Contains(string(body), "Read this long document."):
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"resp_first","object":"response","status":"completed","output":[{"type":"message","id":"msg_first","role":"assistant",`+
				`"content":[{"type":"output_text","text":"Read."}]}],"usage":{"input_tokens":50000,"output_tokens":200,"total_tokens":50200}}`)
		case strings.Contains(string(body), "Summarise it."):
			created(w, "resp_stalled")
			<-r.Context().Done() // past upstream_timeout
		default:
			created(w, "resp_third")
			<-r.Context().Done() // until the caller leaves
		}
	}, func(c *config.Config) { c.Limits.UpstreamTimeout = 2 * time.Second })
	u, key := h.user("standard")
	first, _ := h.answeredRun(u.ID, key, "/v1/responses", `{"model":"fake-gpt","input":"Read this long document."}`, nil)
	handed := first.InTok + first.OutTok

	resp := h.post(key, "/v1/responses", `{"model":"fake-gpt","previous_response_id":"resp_first","input":"Summarise it."}`, nil)
	out := readAll(t, resp.Body)
	resp.Body.Close()
	if run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); resp.StatusCode != http.StatusGatewayTimeout ||
		run.SettleSource.String != holds.SourceUpstreamTimeout || run.InTok < handed {
		t.Fatalf("timed-out call: %d %s; run %+v, want 504 settled upstream_timeout with the %d tokens carried", resp.StatusCode, out, run, handed)
	}

	_, runID := leaveAfterCreated(t, h.post(key, "/v1/responses", `{"model":"fake-gpt","stream":true,"previous_response_id":"resp_stalled","input":"Shorter."}`, nil))
	if run := h.run(u.ID, runID); !run.Estimated || run.InTok < handed {
		t.Fatalf("continuation of the timed-out answer: run %+v, want an estimate of at least the %d tokens the chain carries", run, handed)
	}
}
