package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestPromptEstimateCountsStoredPromptVariables: a Responses call of a stored prompt (prompt:
// {id, variables}) sends the values of its variables, which the provider puts into the prompt
// and bills as input. The stored prompt's own text is not in the body (a known limit), but the
// variables are: left out of the estimate, a caller that knew one stored prompt's id could send
// any amount of prompt through its variables and, leaving before the usage report, be charged
// a few tokens for it (and its output bound within the cap reckoned without them).
func TestPromptEstimateCountsStoredPromptVariables(t *testing.T) {
	up := &lastKeyUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "o", Kind: "openai", BaseURL: ts.URL, Models: []string{"fake*"}}}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
	})
	u, key := h.user("standard")
	big := strings.Repeat("a long prompt the provider reads. ", 2000) // 68 000 bytes
	cases := []struct {
		name, body string
	}{
		{"string variable", `{"model":"fake-gpt","prompt":{"id":"pmpt_1","variables":{"doc":"` + big + `"}},"input":"hi"}`},
		{"input_text variable", `{"model":"fake-gpt","prompt":{"id":"pmpt_1","variables":{"doc":{"type":"input_text","text":"` + big + `"}}}}`},
		// In another case, as a provider decoding with Go's encoding/json reads it.
		{"Variables", `{"model":"fake-gpt","prompt":{"id":"pmpt_1","Variables":{"doc":"` + big + `"}},"input":"hi"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(key, "/v1/responses", tc.body, nil)
			answer := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusBadRequest && errorCode(t, answer) == "invalid_json" {
				return // refused: what it would be estimated at is moot
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, answer)
			}
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			if want := int64(len(big) / 4); run.InTok < want {
				t.Errorf("charged an estimate of %d input tokens for a prompt of over %d bytes (at least %d tokens at 4 bytes a token; estimated=%v, charged %d µUSD)",
					run.InTok, len(big), want, run.Estimated, run.ChargedMicro)
			}
		})
	}
}
