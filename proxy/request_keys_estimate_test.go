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

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/proxy"
)

// newLastKeyHarness is a gateway whose OpenAI and Anthropic upstreams are one lastKeyUpstream,
// on a plan large enough for the tests' big prompts: what a call is charged is its prompt's
// estimate.
func newLastKeyHarness(t *testing.T) (*harness, *lastKeyUpstream) {
	t.Helper()
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
	return h, up
}

// lastKeyUpstream reads a request as Python's json and Go's encoding/json do, the last of
// repeated keys winning at every depth, records it re-encoded (what it ran), and answers
// whole without a usage report, in the route's format: the call is charged the prompt's
// estimate, as one whose caller left before the report.
type lastKeyUpstream struct {
	mu   sync.Mutex
	read []byte
}

func (u *lastKeyUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	read, _ := json.Marshal(m)
	u.mu.Lock()
	u.read = read
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/v1/messages":
		fmt.Fprintf(w, `{"id":"msg_x","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn"}`, m["model"])
	case "/v1/responses":
		fmt.Fprintf(w, `{"id":"resp_x","object":"response","status":"completed","model":%q,"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}]}`, m["model"])
	default:
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`, m["model"])
	}
}

// TestRepeatedKeysCannotShrinkThePromptEstimate: the prompt's estimate stands in for a usage
// report never sent (a caller that leaves before it is charged it) and bounds the call's worst
// case against its cap. It reads the prompt with gjson, which takes the first of repeated
// keys; a provider takes the last. A body that shows the gateway a short system prompt,
// instructions, message or part and the provider a long one had the provider bill the long
// one while the gateway estimated (and charged, and bounded) the short one.
func TestRepeatedKeysCannotShrinkThePromptEstimate(t *testing.T) {
	h, up := newLastKeyHarness(t)
	u, key := h.user("standard")
	big := strings.Repeat("a long prompt the provider reads. ", 2000) // ~68 KB: ~17k tokens
	cases := []struct {
		name, path string
		format     metering.Format
		body       string
	}{
		{"system", "/v1/messages", metering.FormatAnthropic,
			`{"model":"claude-test","max_tokens":10,"system":"hi","messages":[{"role":"user","content":"hi"}],"system":"` + big + `"}`},
		{"instructions", "/v1/responses", metering.FormatResponses,
			`{"model":"fake-gpt","instructions":"hi","input":"hi","instructions":"` + big + `"}`},
		{"response_format", "/v1/chat/completions", metering.FormatChat,
			`{"model":"fake-gpt","response_format":{"type":"text"},"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","description":"` + big + `"}}}`},
		{"message content", "/v1/chat/completions", metering.FormatChat,
			`{"model":"fake-gpt","messages":[{"role":"user","content":"hi","content":"` + big + `"}]}`},
		{"part text", "/v1/chat/completions", metering.FormatChat,
			`{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"hi","text":"` + big + `"}]}]}`},
		{"anthropic part text", "/v1/messages", metering.FormatAnthropic,
			`{"model":"claude-test","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"hi","text":"` + big + `"}]}]}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(key, tc.path, tc.body, nil)
			answer := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusBadRequest {
				errorCode(t, answer)
				return // refused: fine
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, answer)
			}
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			up.mu.Lock()
			read := up.read
			up.mu.Unlock()
			want, _ := metering.EstimatePrompt(tc.format, read)
			if run.InTok < want {
				t.Errorf("charged an estimate of %d input tokens; the prompt the upstream read estimates at %d (estimated=%v, charged %d µUSD)",
					run.InTok, want, run.Estimated, run.ChargedMicro)
			}
		})
	}
}
