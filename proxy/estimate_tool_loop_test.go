package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestPromptEstimateCountsToolLoopParts: what a tool loop sends back — a chat custom tool
// call's input (tool_calls[].custom.input, GPT-5's custom tools), a Responses MCP server's tool
// list (an mcp_list_tools item's tools, which the provider reads instead of listing them
// again) — is prompt the provider bills as input. Left out of the estimate, a caller could put
// any amount of prompt there and, leaving before the usage report, be charged a few tokens.
func TestPromptEstimateCountsToolLoopParts(t *testing.T) {
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
		name, path, body string
	}{
		{"chat custom tool call", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"custom","custom":{"name":"f","input":"` + big + `"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`},
		{"responses mcp tool list", "/v1/responses",
			`{"model":"fake-gpt","input":[{"type":"mcp_list_tools","id":"mcpl_1","server_label":"s","tools":[{"name":"t","description":"` + big + `","input_schema":{"type":"object"}}]},{"role":"user","content":"hi"}]}`},
		// In another case, as a provider decoding with Go's encoding/json reads it.
		{"chat custom tool call, Input", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"custom","custom":{"name":"f","Input":"` + big + `"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`},
		{"chat custom tool call, Custom", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"custom","Custom":{"name":"f","input":"` + big + `"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`},
		{"responses custom tool call, Input", "/v1/responses",
			`{"model":"fake-gpt","input":[{"role":"user","content":"hi"},{"type":"custom_tool_call","call_id":"c1","name":"f","Input":"` + big + `"}]}`},
		{"responses mcp tool list, Tools", "/v1/responses",
			`{"model":"fake-gpt","input":[{"type":"mcp_list_tools","id":"mcpl_1","server_label":"s","Tools":[{"name":"t","description":"` + big + `"}]},{"role":"user","content":"hi"}]}`},
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
