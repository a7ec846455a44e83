package proxy_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestCancelledPlainCallsTallyKeepsItsEstimatedMark: a plain stream its caller left midway is
// charged an estimate (SourceCancel, estimated), and its tally, written beside the settlement
// (tallyPlainCall: no final event, so none rode with the fingerprint), must say so too: it is
// what a reconciler settles the run from, or refunds a paused charge from, should the
// settlement fail, and a tally without the mark has that run recorded as charged what the
// provider reported.
func TestCancelledPlainCallsTallyKeepsItsEstimatedMark(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	runID := streamThenLeave(t, h, key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`, `"content":"tok`, 5)
	r := h.run(u.ID, runID)
	if r.SettleSource.String != holds.SourceCancel || !r.Estimated {
		t.Fatalf("run = %+v, want settled by cancel, estimated", r)
	}
	tl, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found || tl.Calls != 1 || tl.CostMicro != r.CostMicro || tl.EstimatedCalls != 1 {
		t.Fatalf("tally %+v (found %v, %v) of a call settled at %d µUSD, estimated: want that call once, estimated", tl, found, err, r.CostMicro)
	}
}
