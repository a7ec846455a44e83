package fakellm_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// start serves s on a loopback listener for the test's lifetime.
func start(t *testing.T, s http.Handler) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts
}

// call posts body to path with headers given as "Key", "value" pairs.
func call(t *testing.T, ts *httptest.Server, path, body string, headers ...string) *http.Response {
	t.Helper()
	return callCtx(t, context.Background(), ts, path, body, headers...)
}

func callCtx(t *testing.T, ctx context.Context, ts *httptest.Server, path, body string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if path == "/v1/messages" {
		req.Header.Set("anthropic-version", "2023-06-01")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// readAll reads a body that must end cleanly.
func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return string(b)
}

type event struct {
	name string // from an "event:" line, "" if none
	data string
}

// parseSSE splits a stream into events; a body that is not SSE fails the test.
func parseSSE(t *testing.T, body string) []event {
	t.Helper()
	var out []event
	var cur event
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" || cur.name != "" {
				out = append(out, cur)
			}
			cur = event{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("not an SSE line: %q", line)
		}
	}
	if cur.data != "" || cur.name != "" {
		t.Fatalf("stream ends inside an event: %+v", cur)
	}
	return out
}

// result is what the gateway would meter from an answer.
type result struct {
	text    string
	finish  string // finish_reason, Responses status, or Anthropic stop_reason
	prompt  int64
	output  int64
	usage   bool // a usage object was reported
	errored bool // the stream carried an error
	done    bool // OpenAI streams: [DONE] came
}

// meter reads an answer of any route the way the gateway's billing rules say
// (the last usage seen wins; Anthropic's message_delta replaces message_start).
func meter(t *testing.T, path string, stream bool, body string) result {
	t.Helper()
	var r result
	if !stream {
		if !gjson.Valid(body) {
			t.Fatalf("%s: body is not JSON: %q", path, body)
		}
		v := gjson.Parse(body)
		switch path {
		case "/v1/chat/completions":
			r.text = v.Get("choices.0.message.content").Str
			r.finish = v.Get("choices.0.finish_reason").Str
		case "/v1/completions":
			r.text = v.Get("choices.0.text").Str
			r.finish = v.Get("choices.0.finish_reason").Str
		case "/v1/responses":
			r.text = v.Get("output.0.content.0.text").Str
			r.finish = v.Get("status").Str
			if u := v.Get("usage"); u.IsObject() {
				r.usage, r.prompt, r.output = true, u.Get("input_tokens").Int(), u.Get("output_tokens").Int()
			}
			return r
		case "/v1/messages":
			r.text = v.Get("content.0.text").Str
			r.finish = v.Get("stop_reason").Str
			if u := v.Get("usage"); u.IsObject() {
				r.usage, r.prompt, r.output = true, u.Get("input_tokens").Int(), u.Get("output_tokens").Int()
			}
			return r
		}
		if u := v.Get("usage"); u.IsObject() {
			r.usage, r.prompt, r.output = true, u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int()
		}
		return r
	}
	for _, ev := range parseSSE(t, body) {
		if ev.data == "[DONE]" {
			r.done = true
			continue
		}
		if !gjson.Valid(ev.data) {
			t.Fatalf("event data is not JSON: %q", ev.data)
		}
		v := gjson.Parse(ev.data)
		if v.Get("error").Exists() || ev.name == "error" {
			r.errored = true
		}
		switch path {
		case "/v1/chat/completions", "/v1/completions":
			if path == "/v1/completions" {
				r.text += v.Get("choices.0.text").Str
			} else {
				r.text += v.Get("choices.0.delta.content").Str
			}
			if f := v.Get("choices.0.finish_reason"); f.Type == gjson.String {
				r.finish = f.Str
			}
			if u := v.Get("usage"); u.IsObject() {
				r.usage, r.prompt, r.output = true, u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int()
			}
		case "/v1/responses":
			if typ := v.Get("type").Str; typ != ev.name {
				t.Fatalf("event %q carries type %q", ev.name, typ)
			}
			switch ev.name {
			case "response.output_text.delta":
				r.text += v.Get("delta").Str
			case "response.completed", "response.incomplete", "response.failed":
				r.finish = v.Get("response.status").Str
				if u := v.Get("response.usage"); u.IsObject() {
					r.usage, r.prompt, r.output = true, u.Get("input_tokens").Int(), u.Get("output_tokens").Int()
				}
			}
		case "/v1/messages":
			if typ := v.Get("type").Str; typ != ev.name {
				t.Fatalf("event %q carries type %q", ev.name, typ)
			}
			switch ev.name {
			case "message_start":
				if u := v.Get("message.usage"); u.IsObject() {
					r.usage, r.prompt, r.output = true, u.Get("input_tokens").Int(), u.Get("output_tokens").Int()
				}
			case "content_block_delta":
				r.text += v.Get("delta.text").Str
			case "message_delta":
				r.finish = v.Get("delta.stop_reason").Str
				if u := v.Get("usage.output_tokens"); u.Exists() {
					r.usage, r.output = true, u.Int()
				}
			}
		}
	}
	return r
}

// words is the answer text for n tokens.
func words(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString("tok")
		b.WriteString(strconv.Itoa(i))
		b.WriteByte(' ')
	}
	return b.String()
}
