package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
)

// TestCaseFoldedKeysCannotChangeWhatIsBilled: Go's encoding/json (the parser jsonUpstream
// stands for, and that of Go-based OpenAI-compatible servers) matches an object's keys to
// fields case-insensitively, with Unicode folding ("Model", "MODEL", "ſtream" with U+017F),
// the last match winning. A body whose keys differ only so is one key to such a provider and
// two (or none) to the gateway.
func TestCaseFoldedKeysCannotChangeWhatIsBilled(t *testing.T) {
	up := &jsonUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "json", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
		cheap := c.Models["fake-gpt"]
		cheap.Input.Micro, cheap.Output.Micro = 1, 1
		c.Models["cheap"] = cheap
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
	})
	u, key := h.user("standard")
	cases := []struct{ name, body string }{
		{"Model", `{"model":"cheap","messages":[{"role":"user","content":"hi"}],"Model":"fake-gpt"}`},
		{"Include_Usage", `{"model":"fake-gpt","stream":true,"stream_options":{"include_usage":true,"Include_Usage":false},"messages":[{"role":"user","content":"hi"}]}`},
		{"Stream alone", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"Stream":true}`},
		{"long s stream", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"ſtream":true}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(key, "/v1/chat/completions", tc.body, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusBadRequest {
				errorCode(t, body)
				return // refused: fine
			}
			runID := resp.Header.Get("X-Tollgate-Run-Id")
			run := h.run(u.ID, runID)
			// jsonUpstream names in its answer the model it decoded, i.e. ran.
			if ran := gjson.GetBytes(body, "model"); ran.Exists() && ran.Str != run.Model {
				t.Errorf("billed as model %q, the upstream ran %q (charged %d µUSD)", run.Model, ran.Str, run.ChargedMicro)
			}
			if run.Estimated || run.OutTok != 5000 {
				t.Errorf("the upstream produced 5000 output tokens; billed out_tok=%d estimated=%v (charged %d µUSD)", run.OutTok, run.Estimated, run.ChargedMicro)
			}
		})
	}
}
