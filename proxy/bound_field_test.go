package proxy_test

import (
	"net/http"
	"testing"
)

// TestAddedBoundUsesTheModelsField: a chat request that sets no output bound is given one
// when its worst case would pass its cap — in max_tokens by default, which OpenAI's
// reasoning models (o1, o3, o4-mini, gpt-5) refuse with 400 ("use max_completion_tokens
// instead"). A model configured with output_bound_field: max_completion_tokens gets that
// field, and no max_tokens; one without keeps max_tokens, which every compatible server
// reads.
func TestAddedBoundUsesTheModelsField(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		m := c.Models["fake-gpt"]
		m.MaxOutputTokens = 100_000_000 // far past what the default cap pays for
		c.Models["fake-gpt"] = m
		m.OutputBoundField = "max_completion_tokens"
		c.Models["fake-o3"] = m
	})
	_, key := h.user("standard")
	for _, tc := range []struct{ model, field, absent string }{
		{"fake-o3", "max_completion_tokens", "max_tokens"},
		{"fake-gpt", "max_tokens", "max_completion_tokens"},
	} {
		resp := h.post(key, "/v1/chat/completions", `{"model":"`+tc.model+`","messages":[{"role":"user","content":"hi"}]}`, nil)
		b := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.model, resp.StatusCode, b)
		}
		sent := up.last(t)
		if n := sent.Get(tc.field).Int(); n < 1 || n >= 100_000_000 {
			t.Errorf("%s: upstream got %s=%d, want the bound the cap pays for", tc.model, tc.field, n)
		}
		if sent.Get(tc.absent).Exists() {
			t.Errorf("%s: upstream got %s too: %s", tc.model, tc.absent, sent.Raw)
		}
	}
}
