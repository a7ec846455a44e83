package proxy_test

import (
	"net/http"
	"testing"
)

// TestRewriteBoundsEveryOutputField: the rewrite must leave no way for the upstream to
// produce more output than the cap pays for. A chat request may carry both max_tokens and
// max_completion_tokens (providers differ on which wins: vLLM takes max_completion_tokens),
// and n (best_of on completions) choices each up to the bound.
func TestRewriteBoundsEveryOutputField(t *testing.T) {
	h, up := jsonHarness(t)
	_, key := h.user("standard")
	// Default cap 500 credits = 500 000 µUSD; fake-gpt output is 10 µUSD a token, so the
	// whole answer may be at most 50 000 output tokens.
	const capTokens = 50_000
	cases := []struct{ name, path, body string }{
		{"both fields, max_tokens smaller", "/v1/chat/completions",
			`{"model":"fake-gpt","max_tokens":1,"max_completion_tokens":90000000,"messages":[{"role":"user","content":"hi"}]}`},
		{"both fields, both over", "/v1/chat/completions",
			`{"model":"fake-gpt","max_tokens":80000000,"max_completion_tokens":90000000,"messages":[{"role":"user","content":"hi"}]}`},
		{"n choices", "/v1/chat/completions",
			`{"model":"fake-gpt","n":8,"max_tokens":90000000,"messages":[{"role":"user","content":"hi"}]}`},
		{"best_of", "/v1/completions",
			`{"model":"fake-gpt","best_of":8,"max_tokens":90000000,"prompt":"hi"}`},
		// The most of n and best_of, whichever comes last: a provider that ignores best_of
		// (or takes n above it) still writes n answers.
		{"n above best_of", "/v1/completions",
			`{"model":"fake-gpt","n":8,"best_of":2,"max_tokens":90000000,"prompt":"hi"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(key, tc.path, tc.body, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusBadRequest {
				errorCode(t, body)
				return
			}
			raw := up.last(t)
			choices := max(int64(1), raw.Get("n").Int(), raw.Get("best_of").Int())
			for _, f := range []string{"max_tokens", "max_completion_tokens"} {
				if v := raw.Get(f); v.Exists() && v.Int()*choices > capTokens {
					t.Errorf("upstream got %s=%d with %d choices: up to %d output tokens, the cap pays for %d",
						f, v.Int(), choices, v.Int()*choices, capTokens)
				}
			}
		})
	}
}
