package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestPromptEstimateCountsLegacyPromptFields: a call whose usage never comes (a caller that
// leaves before it, a provider that sends none) is charged its prompt's estimate, and the same
// estimate bounds its output within the cap. Chat's legacy function calling — function
// definitions in 'functions', an assistant turn's 'function_call' sent back — and a
// completion's 'suffix' are prompt the provider reads and bills as input; left out of the
// estimate, a caller could put any amount of prompt there and be charged a few tokens for it
// (spelt in another case, as a provider that folds keys reads them, such a body is refused).
func TestPromptEstimateCountsLegacyPromptFields(t *testing.T) {
	up := &lastKeyUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{
			{Name: "o", Kind: "openai", BaseURL: ts.URL, Models: []string{"fake*"}},
			{Name: "a", Kind: "anthropic", BaseURL: ts.URL, Models: []string{"claude*"}},
		}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
	})
	u, key := h.user("standard")
	big := strings.Repeat("a long prompt the provider reads. ", 2000) // 68 000 bytes
	cases := []struct {
		name, path, body string
	}{
		{"functions", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"functions":[{"name":"f","description":"` + big + `","parameters":{"type":"object"}}]}`},
		{"function_call sent back", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"` + big + `"}},{"role":"function","name":"f","content":"ok"}]}`},
		{"completion suffix", "/v1/completions",
			`{"model":"fake-gpt","prompt":"hi","suffix":"` + big + `"}`},
		// In another case: a provider decoding with Go's encoding/json reads them as the above.
		{"Functions", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"Functions":[{"name":"f","description":"` + big + `"}]}`},
		{"Function_Call", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","Function_Call":{"name":"f","arguments":"` + big + `"}}]}`},
		{"function_call Arguments", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","function_call":{"name":"f","Arguments":"` + big + `"}}]}`},
		{"Response_Format", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"Response_Format":{"type":"json_schema","json_schema":{"name":"x","description":"` + big + `"}}}`},
		{"Instructions", "/v1/responses",
			`{"model":"fake-gpt","input":"hi","Instructions":"` + big + `"}`},
		{"Text format", "/v1/responses",
			`{"model":"fake-gpt","input":"hi","Text":{"format":{"type":"json_schema","name":"x","schema":{"description":"` + big + `"}}}}`},
		{"text Format", "/v1/responses",
			`{"model":"fake-gpt","input":"hi","text":{"Format":{"type":"json_schema","name":"x","schema":{"description":"` + big + `"}}}}`},
		{"System", "/v1/messages",
			`{"model":"claude-test","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"System":"` + big + `"}`},
		{"Suffix", "/v1/completions",
			`{"model":"fake-gpt","prompt":"hi","Suffix":"` + big + `"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(key, tc.path, tc.body, nil)
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
