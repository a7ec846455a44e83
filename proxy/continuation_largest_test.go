package proxy_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestContinuationCarriesTheLargestOfItsRecords: a request that names both an earlier answer
// (previous_response_id) and a conversation carries the larger of their records (a
// continuation carries the whole chain, which each record already counts), whichever it names
// last. Taken from the last id alone, a stream cut before its usage, continuing an answer that
// handed on 50 000 tokens within a conversation that had recorded a few, was charged the few.
func TestContinuationCarriesTheLargestOfItsRecords(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	// The conversation's record: one small answer in it.
	h.answeredRun(u.ID, key, "/v1/responses", `{"model":"fake-gpt","conversation":"conv_small","input":"Hi."}`,
		map[string]string{fakellm.HeaderPromptTokens: "10", fakellm.HeaderChunks: "2"})
	prev, handed := h.answerWithContext(u.ID, key, `{"model":"fake-gpt","input":"Read this long document."}`)
	_, runID := leaveAfterCreated(t, h.post(key, "/v1/responses",
		`{"model":"fake-gpt","stream":true,"previous_response_id":"`+prev+`","conversation":"conv_small","input":"Summarise it."}`,
		map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"}))
	run := h.run(u.ID, runID)
	if !run.Estimated {
		t.Fatalf("run %+v, want an estimate", run)
	}
	if run.InTok < handed {
		t.Fatalf("estimated in_tok %d, want at least the %d tokens of context the earlier answer handed on", run.InTok, handed)
	}
}
