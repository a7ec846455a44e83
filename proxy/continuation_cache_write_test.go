package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestContinuedResponseCarriesItsCacheWrites: the context an answer hands on is its whole
// prompt as reported, the part the provider wrote to its cache included (a router serving
// Claude behind the Responses shape reports it as input_tokens_details.cache_write_tokens):
// a continuation carries it, and the provider bills it again. A continuation the caller leaves
// before its usage is estimated with all of it; without the written part, a prompt the
// provider had just cached was carried on as the small rest of it.
func TestContinuedResponseCarriesItsCacheWrites(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), "previous_response_id") {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"resp_written","object":"response","status":"completed","model":"fake-gpt",`+
				`"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Read."}]}],`+
				`"usage":{"input_tokens":50000,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":40000},"output_tokens":5,"total_tokens":50005}}`)
			return
		}
		// The continuation: started, then nothing until its caller leaves.
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_next\",\"status\":\"in_progress\"}}\n\n"+
			"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":{\"id\":\"resp_next\",\"status\":\"in_progress\"}}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}, nil)
	u, key := h.user("standard")
	first, _ := h.answeredRun(u.ID, key, "/v1/responses", `{"model":"fake-gpt","input":"Read this long document."}`, nil)
	if first.CacheWriteTok != 40_000 {
		t.Fatalf("first answer %+v: want its 40 000 tokens written to the cache", first)
	}
	handed := first.InTok + first.CacheReadTok + first.CacheWriteTok + first.OutTok
	_, runID := leaveAfterCreated(t, h.post(key, "/v1/responses",
		`{"model":"fake-gpt","stream":true,"previous_response_id":"resp_written","input":"Go on."}`, nil))
	if run := h.run(u.ID, runID); !run.Estimated || run.InTok < handed {
		t.Fatalf("continuation %+v: want estimated in_tok of at least the %d tokens handed on (%d written to the cache)", run, handed, first.CacheWriteTok)
	}
}
