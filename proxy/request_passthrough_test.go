package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// bodyTransport keeps the body of every request the gateway sends the upstream, as it went on
// the wire, and passes the request on.
type bodyTransport struct {
	inner http.RoundTripper
	mu    sync.Mutex
	sent  [][]byte
}

func (b *bodyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.sent = append(b.sent, body)
	b.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	return b.inner.RoundTrip(r)
}

// last is the body of the last request sent.
func (b *bodyTransport) last(t *testing.T) []byte {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.sent) == 0 {
		t.Fatal("no request reached the upstream")
	}
	return b.sent[len(b.sent)-1]
}

// TestRequestBodyReachesTheUpstreamByteForByte: DESIGN §3 step 4 — the gateway edits the raw
// bytes (sjson) in two places only, a stream's stream_options.include_usage when the caller did
// not ask for usage and an output bound the cap needs lowered; the rest of the body passes
// through untouched: its key order, spacing, escapes, number spellings and the fields the
// gateway does not know, on every route. A body re-encoded would change what the provider
// runs (a number's precision, a key's duplicate) from what was metered.
func TestRequestBodyReachesTheUpstreamByteForByte(t *testing.T) {
	tr := &bodyTransport{inner: http.DefaultTransport}
	h := newHarnessOn(t, harnessSetup{transport: tr}, func(c *configT) { c.Plans["standard"] = bigPlan(c.Plans["standard"]) })
	_, key := h.user("standard")
	setUsage := func(t *testing.T, b string) []byte {
		out, err := sjson.SetBytes([]byte(b), "stream_options.include_usage", true)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	untouched := func(_ *testing.T, b string) []byte { return []byte(b) }
	for _, c := range []struct {
		name, path, body string
		want             func(*testing.T, string) []byte
	}{
		{"chat", "/v1/chat/completions", "{ \"messages\" : [ {\"role\":\"user\",\"content\":\"h\\u00e9llo \\\"q\\\" \\/ 🚀\"} ],\n\t\"model\":\"fake-gpt\",  " +
			`"temperature": 1.50, "top_p":1E0, "seed": 12345678901234567890, "max_tokens": 20, "x_vendor": {"nested":[1,2,{"a":null}]}, "metadata": {} }`, untouched},
		{"chat in surrounding whitespace", "/v1/chat/completions", "\r\n  {\"model\":\"fake-gpt\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n\n", untouched},
		{"chat stream in surrounding whitespace", "/v1/chat/completions", " {\"model\":\"fake-gpt\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n", setUsage},
		{"chat stream that asked for usage", "/v1/chat/completions",
			`{"stream":true,"stream_options": {"include_usage" : true, "continuous_usage_stats":false},"model":"fake-gpt","messages":[{"role":"user","content":"a\tb"}]}`, untouched},
		{"chat stream that did not ask", "/v1/chat/completions",
			`{"model":"fake-gpt", "stream": true, "logprobs":false, "messages":[{"role":"user","content":"x\u2028y"}], "n":1}`, setUsage},
		{"chat stream that said no", "/v1/chat/completions",
			`{"model":"fake-gpt","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true},"messages":[{"role":"user","content":"no usage please"}]}`, setUsage},
		{"completions", "/v1/completions", `{"prompt": ["one", "two"], "model": "fake-gpt", "max_tokens": 7, "logit_bias": {"50256": -100}, "echo": false}`, untouched},
		{"completions stream", "/v1/completions", `{"prompt":"go on","model":"fake-gpt","stream":true,"suffix":null}`, setUsage},
		{"embeddings", "/v1/embeddings", `{"input": ["a", "b"],"model":"fake-gpt","encoding_format":"base64","dimensions":256,"user":"u-1"}`, untouched},
		{"responses", "/v1/responses", `{"model":"fake-gpt","input":[{"role":"user","content":"hi"}], "reasoning":{"effort":"low"}, "max_output_tokens":64, "store":false}`, untouched},
		{"responses stream", "/v1/responses", `{"model":"fake-gpt","stream":true,"input":"hi","text":{"format":{"type":"text"}},"truncation":"auto"}`, untouched},
		{"messages", "/v1/messages", `{"model":"claude-test","max_tokens":64,"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"hi"}],"top_k":5,"metadata":{"user_id":"u"}}`, untouched},
		{"messages stream", "/v1/messages", `{"stream":true,"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stop_sequences":["\n\nHuman:"]}`, untouched},
	} {
		t.Run(c.name, func(t *testing.T) {
			h.postOK(t, key, c.path, c.body, nil)
			if got, want := tr.last(t), c.want(t, c.body); !bytes.Equal(got, want) {
				t.Errorf("the upstream was sent\n%s\nwant\n%s", got, want)
			}
		})
	}

	// A bound lowered for the cap: that field alone changes.
	t.Run("bound lowered", func(t *testing.T) {
		u, key := h.user("standard")
		allowance := int64(3000) // 3 credits: at 10 USD/M output, under 300 output tokens
		if err := h.store.SetUserLimits(context.Background(), u.ID, &allowance, nil, nil); err != nil {
			t.Fatal(err)
		}
		body := `{"max_tokens" : 100000, "model":"fake-gpt","messages":[{"role":"user","content":"long answer"}], "temperature":0.70}`
		h.postOK(t, key, "/v1/chat/completions", body, nil)
		got := tr.last(t)
		bound := gjson.GetBytes(got, "max_tokens").Int()
		if bound <= 0 || bound >= 300 {
			t.Fatalf("max_tokens sent %d, want it lowered under 300", bound)
		}
		want, err := sjson.SetBytes([]byte(body), "max_tokens", bound)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("the upstream was sent\n%s\nwant\n%s", got, want)
		}
	})
}
