package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestPromptEstimateCountsRefusalsSentBack: an assistant turn sent back with a refusal — chat's
// message-level 'refusal', or a content part of type refusal (chat's, or a Responses
// output message's) — is prompt the provider reads and bills as input. The estimate (the
// charge of a call whose usage never comes, and its output bound within the cap) read only a
// part's 'text', so a caller could put any amount of prompt there and be charged a few tokens.
func TestPromptEstimateCountsRefusalsSentBack(t *testing.T) {
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
		{"chat message refusal", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","refusal":"` + big + `"},{"role":"user","content":"please"}]}`},
		{"chat refusal part", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"refusal","refusal":"` + big + `"}]},{"role":"user","content":"please"}]}`},
		{"responses refusal part", "/v1/responses",
			`{"model":"fake-gpt","input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"refusal","refusal":"` + big + `"}]},{"role":"user","content":"please"}]}`},
		// In another case, as a provider decoding with Go's encoding/json reads it.
		{"chat message Refusal", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","Refusal":"` + big + `"}]}`},
		{"chat refusal part, Refusal", "/v1/chat/completions",
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"refusal","Refusal":"` + big + `"}]}]}`},
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
