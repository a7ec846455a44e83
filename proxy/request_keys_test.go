package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
)

// jsonUpstream is an OpenAI-compatible upstream that, like real providers (Python's json,
// Go's encoding/json), reads a JSON object with repeated keys by the last occurrence.
// It reports 1000 prompt and 5000 completion tokens (a reasoning model: most of the output
// is hidden reasoning, so the stream's visible text is short), and streams usage only when
// stream_options.include_usage is on, as OpenAI does.
type jsonUpstream struct {
	mu   sync.Mutex
	seen []map[string]any
}

func (u *jsonUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(raw, &req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	m["model"] = req.Model // the model it runs: encoding/json's match (case folded, last wins)
	u.mu.Lock()
	u.seen = append(u.seen, m)
	u.mu.Unlock()
	usage := `{"prompt_tokens":1000,"completion_tokens":5000,"total_tokens":6000}`
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":%s}`, req.Model, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"},\"finish_reason\":null}]}\n\n", req.Model)
	fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", req.Model)
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[],\"usage\":%s}\n\n", req.Model, usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// TestRepeatedKeysCannotChangeWhatIsBilled: the gateway reads the request with gjson, which
// takes the first of repeated keys; providers take the last. And Go's encoding/json (what
// jsonUpstream stands for, with Go-based OpenAI-compatible servers) matches keys to fields
// with case folded ("Model", "ſtream" with U+017F), so keys that differ only so are one key
// to such a provider and two, or none, to the gateway. A body that names one thing to the
// gateway and another to the provider must be refused, or it is billed for what it did not
// run: a cheap model's price for an expensive model, or an estimate (no reasoning tokens) for
// a stream whose usage report the provider was told not to send.
func TestRepeatedKeysCannotChangeWhatIsBilled(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		cheap := c.Models["fake-gpt"]
		cheap.Input.Micro, cheap.Output.Micro = 1, 1 // $0.000001 per million
		c.Models["cheap"] = cheap
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
	})
	u, key := h.user("standard")
	cases := []struct{ name, body string }{
		{"model", `{"model":"cheap","messages":[{"role":"user","content":"hi"}],"model":"fake-gpt"}`},
		{"model escaped", `{"model":"cheap","messages":[{"role":"user","content":"hi"}],"mod\u0065l":"fake-gpt"}`},
		{"include_usage", `{"model":"fake-gpt","stream":true,"stream_options":{"include_usage":true,"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`},
		{"stream", `{"model":"fake-gpt","stream":false,"messages":[{"role":"user","content":"hi"}],"stream":true}`},
		{"Model", `{"model":"cheap","messages":[{"role":"user","content":"hi"}],"Model":"fake-gpt"}`},
		{"Include_Usage", `{"model":"fake-gpt","stream":true,"stream_options":{"include_usage":true,"Include_Usage":false},"messages":[{"role":"user","content":"hi"}]}`},
		{"Stream alone", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"Stream":true}`},
		{"long s stream", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"ſtream":true}`},
		// An empty key is a key: repeated, it must not read as "no repeat", nor hide a later one.
		{"after a repeated empty key", `{"model":"cheap","":0,"":0,"messages":[{"role":"user","content":"hi"}],"model":"fake-gpt"}`},
		{"stream after a repeated empty key", `{"model":"fake-gpt","stream":false,"":0,"":0,"messages":[{"role":"user","content":"hi"}],"stream":true}`},
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
			if served := up.last(t).Get("model").Str; run.Model != served {
				t.Errorf("billed as model %q, the upstream ran %q (charged %d µUSD)", run.Model, served, run.ChargedMicro)
			}
			if run.Estimated || run.OutTok != 5000 {
				t.Errorf("the upstream produced 5000 output tokens; billed out_tok=%d estimated=%v (charged %d µUSD)", run.OutTok, run.Estimated, run.ChargedMicro)
			}
		})
	}
}

// jsonHarness is a gateway whose one upstream, for every model, is a jsonUpstream; more
// adjusts the configuration after that.
func jsonHarness(t *testing.T, more ...func(*config.Config)) (*harness, *jsonUpstream) {
	up := &jsonUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "json", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
		for _, f := range more {
			f(c)
		}
	})
	return h, up
}

// last is the body of the last call the upstream was sent.
func (u *jsonUpstream) last(t *testing.T) gjson.Result {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.seen) == 0 {
		t.Fatal("the upstream was sent no call")
	}
	return gjson.Parse(mustJSON(t, u.seen[len(u.seen)-1]))
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
