package proxy_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestFreeModelCallsAreTallied: a model priced at 0 (README: "0 for a free model") costs
// nothing, but its calls are tallied with what they used all the same: the tally is what the
// reconciler settles a run from, and the run's row then shows its tokens and calls. A call
// that cost 0 but used tokens is no call that used nothing (a zero tally), and a usage report
// after the final event that changes the tokens but not the cost still corrects the tally.
func TestFreeModelCallsAreTallied(t *testing.T) {
	free := func(c *config.Config) {
		m := c.Models["fake-gpt"]
		m.Input.Micro, m.CacheRead.Micro, m.CacheWrite.Micro, m.Output.Micro = 0, 0, 0, 0
		c.Models["fake-gpt"] = m
	}
	t.Run("client left", func(t *testing.T) {
		h := newHarness(t, free)
		u, key := h.user("standard")
		runID := streamThenLeave(t, h, key, "/v1/chat/completions",
			`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`, `"content":"tok`, 5)
		r := h.run(u.ID, runID)
		tallied, found, err := h.tally.Get(context.Background(), runID)
		if err != nil || !found {
			t.Fatalf("no tally (%v)", err)
		}
		if r.InTok == 0 || r.OutTok == 0 || tallied.Calls != 1 || tallied.Usage.Input != r.InTok || tallied.Usage.Output != r.OutTok ||
			tallied.EstimatedCalls != 1 {
			t.Fatalf("tally %+v for a free call settled with %d input and %d output tokens, estimated: want them, one call",
				tallied, r.InTok, r.OutTok)
		}
	})
	t.Run("usage after the final event", func(t *testing.T) {
		h := newHarness(t, func(c *config.Config) { free(c); c.Upstreams[0].BaseURL = usageAfterFinalUpstream(t) })
		u, key := h.user("standard")
		resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
		readAll(t, resp.Body)
		resp.Body.Close()
		r := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
		tallied, found, err := h.tally.Get(context.Background(), r.RunID)
		if err != nil || !found {
			t.Fatalf("no tally (%v)", err)
		}
		if r.OutTok != 50 || tallied.Usage.Output != 50 || tallied.Calls != 1 {
			t.Fatalf("tally %+v, settled %d output tokens: want the last report's 50 in both", tallied, r.OutTok)
		}
	})
}
