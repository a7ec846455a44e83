package proxy_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestPlainCallTallySetAgainHoldsOnlyItsLastFigures: a plain stream is tallied at its final
// event ([DONE]) with no usage seen yet, an estimate (its estimated mark set), in the MULTI/EXEC
// that gives its fingerprint back; Redis runs it and the reply is lost. The provider's report
// comes after [DONE], and the call's tally is written again beside its settlement, its figures
// set over the first write's (runstate.Tally.RecordCallWith). The tally must then be that
// second write alone: the report's figures, no estimated call. Set field by field, the
// estimated mark the first write left (a figure of 0 is not written) stayed, and a reconciler
// settling the run from the tally (the settlement failing too) marked it charged an estimate
// though the provider said what it used.
func TestPlainCallTallySetAgainHoldsOnlyItsLastFigures(t *testing.T) {
	up := upstreamSending(t,
		`{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`,
		`[DONE]`,
		`{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":50,"total_tokens":60}}`)
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, func(c *config.Config) { c.Upstreams[0].BaseURL = up })
	u, key := h.user("standard")
	// The call's first write naming a tally: the one that gives its fingerprint back.
	lossy.Arm(h.keys.Prefix+"billing:usage:{", testenv.RedisReplyLost, 1)
	resp, _ := h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	h.settled()
	if lossy.Fired() != 1 {
		t.Fatalf("%d tally replies lost, want 1", lossy.Fired())
	}
	r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if r.OutTok != 50 || r.Estimated {
		t.Fatalf("settled %d output tokens, estimated=%v; want the report's 50, not estimated", r.OutTok, r.Estimated)
	}
	tl, found, err := h.tally.Get(context.Background(), r.RunID)
	if err != nil || !found || tl.Calls != 1 || tl.CostMicro != r.CostMicro || tl.Usage.Output != 50 || tl.EstimatedCalls != 0 {
		t.Fatalf("tally %+v (found %v, %v) of a call settled at %d µUSD, not estimated: want that call once, as settled", tl, found, err, r.CostMicro)
	}
}
