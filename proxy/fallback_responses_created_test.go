package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestFallbackResponsesStreamCutAfterCreatedIsChargedAtTheDearestModel: a Responses stream
// names at its start (response.created) the model it was asked for, and only at its end
// (response.completed) the one that produced the answer (TestResponsesModelIsTheOneThatCompleted).
// A call naming fallbacks (`models`) whose stream ends before its final event has no word of
// which of them answered: its estimate is charged at the dearest model that may have, as a chat
// call's cut before its answer named a model is (TestFallbackCallWithoutAnAnswerIsChargedAtTheDearestModel).
// Taken for the answer's word, response.created's name of the model asked for billed a
// prompt and output a fallback eight times dearer worked on at an eighth.
func TestFallbackResponsesStreamCutAfterCreatedIsChargedAtTheDearestModel(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		// The router names the model asked for, streams a fallback's words, and the stream
		// ends before response.completed says which model wrote them.
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_cut\",\"object\":\"response\",\"model\":\"fake-gpt\",\"status\":\"in_progress\"}}\n\n")
		fmt.Fprintf(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":%q}\n\n", strings.Repeat("word ", 400))
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, routerWithDearModel(up.URL))
	u, key := h.user("standard")
	m := h.cfg.Models["fake-gpt"]
	for _, tc := range []struct {
		models string
		times  int64 // the price of the estimate, in fake-gpt's prices
	}{{`["fake-gpt","dear-gpt"]`, 8}, {`["fake-gpt"]`, 1}} {
		body := `{"model":"fake-gpt","models":` + tc.models + `,"stream":true,"input":"` + strings.Repeat("word ", 4000) + `"}`
		resp := h.post(key, "/v1/responses", body, nil)
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
		if run.SettleSource.String != holds.SourceStreamError || !run.Estimated || run.InTok == 0 || run.OutTok == 0 {
			t.Fatalf("models %s: run %+v (answer %.300s), want a stream_error charged its estimate", tc.models, run, answer)
		}
		want := (tc.times*(run.InTok*m.Input.Micro+run.OutTok*m.Output.Micro) + 999_999) / 1_000_000
		if run.CostMicro != want {
			t.Errorf("models %s: cost %d µUSD, want %d (the estimate at %d× fake-gpt's prices)", tc.models, run.CostMicro, want, tc.times)
		}
	}
}
