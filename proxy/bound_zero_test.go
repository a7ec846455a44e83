package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
)

// unboundedOnZero is an upstream that reads an output bound as Ollama's runner does
// (num_predict, fed from max_tokens): a bound of 0 or less is no bound at all, and the model
// writes until it stops on its own, here 100 000 tokens.
type unboundedOnZero struct {
	mu     sync.Mutex
	bounds []string // the raw max_tokens of each call it was sent, "" when absent
}

const unboundedTokens = 100_000

func (u *unboundedOnZero) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	bound := gjson.GetBytes(raw, "max_tokens")
	u.mu.Lock()
	u.bounds = append(u.bounds, bound.Raw)
	u.mu.Unlock()
	out := int64(unboundedTokens)
	if n := bound.Int(); n > 0 {
		out = min(out, n)
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`, out, out+10)
}

func (u *unboundedOnZero) calls() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.bounds...)
}

// TestZeroOutputBoundIsNotForwarded: the rewrite leaves a caller's bound alone when the cap
// pays for it, and a bound of 0 costs nothing at the worst case, so it went upstream as
// sent. But some upstreams read 0 as no bound at all (Ollama: num_predict ≤ 0 generates
// until the model stops), and the call then produced output the cap never paid for: the
// provider's cost past the cap is the operator's loss, and in a named run the call had
// reserved only its prompt. OpenAI, Anthropic and vLLM refuse a bound of 0 anyway, so the
// gateway must refuse it before anything is held (or send a bound the cap pays for).
func TestZeroOutputBoundIsNotForwarded(t *testing.T) {
	up := &unboundedOnZero{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "ollama-like", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
	})
	u, key := h.user("standard")
	// Default cap: 500 credits = 500 000 µUSD; fake-gpt output is 10 µUSD a token.
	const capTokens = 50_000
	cases := []struct{ name, path, body string }{
		{"chat max_tokens", "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`},
		{"completions max_tokens", "/v1/completions", `{"model":"fake-gpt","max_tokens":0,"prompt":"hi"}`},
		{"named run", "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.name == "named run" {
				hdr["X-Run-Id"] = "zero-bound-run"
			}
			before := len(up.calls())
			resp := h.post(key, tc.path, tc.body, hdr)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			h.settled()
			sent := up.calls()[before:]
			if resp.StatusCode == http.StatusBadRequest {
				if code := errorCode(t, body); !strings.HasPrefix(code, "invalid_max") {
					t.Errorf("refused with code %q, want invalid_max_tokens", code)
				}
				if len(sent) != 0 {
					t.Errorf("refused, yet the upstream was sent %d calls", len(sent))
				}
				var live int
				if err := h.db.Get(&live, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND state <> 'settled'", u.ID); err != nil {
					t.Fatal(err)
				}
				if live != 0 {
					t.Errorf("refused, yet %d holds are live", live)
				}
				return
			}
			for _, b := range sent {
				var n int64
				if err := json.Unmarshal([]byte(b), &n); err != nil || n <= 0 || n > capTokens {
					t.Errorf("case %d: %d %s; the upstream was sent max_tokens=%q, which it reads as no bound (or one past the %d tokens the cap pays for)",
						i, resp.StatusCode, body, b, capTokens)
				}
			}
		})
	}
}
