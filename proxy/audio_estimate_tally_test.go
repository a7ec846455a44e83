package proxy_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestAudioEstimateTallyMatchesSettlement: the audio estimate finds parts that the prompt's
// estimate does not count (a "Type" or an input_audio payload read with case folded, as a
// provider decoding with Go's encoding/json reads them), so a prompt's estimate could have
// fewer tokens than its audio part. The settlement's row clamps the prompt up to its audio;
// the Redis tally, what the reconciler settles from when the process dies, stored the smaller
// figure: one call, two token counts, depending on who settled it.
func TestAudioEstimateTallyMatchesSettlement(t *testing.T) {
	h, _ := audioHarness(t, "")
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","messages":[{"role":"user","content":[
		{"Type":"input_audio","input_audio":{"data":"` + wavMinute + `","format":"wav"}}]}]}`
	resp, _ := h.postOK(t, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderUsage: "off"})
	runID := resp.Header.Get(proxy.RunIDHeader)
	run := h.run(u.ID, runID)
	if !run.Estimated {
		t.Fatalf("run %+v not estimated: the test needs an answer without usage", run)
	}
	if run.InTok < 600 {
		t.Fatalf("in_tok %d, want at least the clip's 600 tokens", run.InTok)
	}
	tallied, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found {
		t.Fatalf("tally of %s: found=%v err=%v", runID, found, err)
	}
	if tallied.Usage.Input != run.InTok || tallied.CostMicro != run.CostMicro {
		t.Fatalf("tally in_tok %d cost %d, settlement in_tok %d cost %d: the reconciler would record another prompt",
			tallied.Usage.Input, tallied.CostMicro, run.InTok, run.CostMicro)
	}
}
