package fakellm_test

import (
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/internal/fakellm"
)

const chatBody = `{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]%s}`

func chat(extra string) string { return strings.Replace(chatBody, "%s", extra, 1) }

func TestPromptTokens(t *testing.T) {
	cases := []struct {
		name string
		body string
		want int64
	}{
		{"empty", `{}`, 0},
		// 8 + 11 = 19 bytes -> 5, two messages -> +8
		{"chat", chat(""), 5 + 8},
		{"text parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"e"}]}]}`, 2 + 4},
		{"null content", `{"messages":[{"role":"assistant","content":null},{"role":"user","content":"abcd"}]}`, 1 + 8},
		{"escapes count unescaped", `{"messages":[{"role":"user","content":"\u00e9\n"}]}`, 1 + 4},
		{"anthropic system", `{"system":"abc","messages":[{"role":"user","content":[{"type":"text","text":"defgh"}]}]}`, 2 + 8},
		{"anthropic system blocks", `{"system":[{"type":"text","text":"abcdefgh"}],"messages":[]}`, 2 + 4},
		{"responses string", `{"input":"abcde"}`, 2 + 4},
		{"responses items", `{"instructions":"ab","input":[{"role":"user","content":"cd"},{"type":"message","role":"user","content":[{"type":"input_text","text":"ef"}]}]}`, 2 + 12},
		{"embeddings array", `{"input":["ab","cd","ef"]}`, 2 + 12},
		{"token ids", `{"input":[1,2,3]}`, 0},
		{"legacy prompt", `{"prompt":"abcdefghi"}`, 3 + 4},
	}
	for _, c := range cases {
		if got := fakellm.PromptTokens([]byte(c.body)); got != c.want {
			t.Errorf("%s: PromptTokens = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestChatStreamChunks(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{}))
	for _, c := range []struct {
		header string
		want   int
	}{{"", fakellm.DefaultChunks}, {"3", 3}, {"0", 0}, {"100", 100}} {
		resp := call(t, ts, "/v1/chat/completions", chat(`,"stream":true`), fakellm.HeaderChunks, c.header)
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("Content-Type = %q", ct)
		}
		evs := parseSSE(t, readAll(t, resp))
		// role chunk, one per token, finish chunk, [DONE]
		if len(evs) != c.want+3 {
			t.Fatalf("chunks=%q: %d events, want %d", c.header, len(evs), c.want+3)
		}
		if role := gjson.Get(evs[0].data, "choices.0.delta.role").Str; role != "assistant" {
			t.Errorf("first chunk role = %q", role)
		}
		for i, ev := range evs[:len(evs)-1] {
			v := gjson.Parse(ev.data)
			if v.Get("object").Str != "chat.completion.chunk" || v.Get("model").Str != "gpt-4o" || v.Get("usage").Exists() {
				t.Fatalf("chunk %d: %s", i, ev.data)
			}
		}
		r := meter(t, "/v1/chat/completions", true, strings.Join(dataLines(evs), ""))
		if r.text != words(c.want) || r.finish != "stop" || !r.done || r.usage {
			t.Errorf("chunks=%q: %+v", c.header, r)
		}
	}
}

// dataLines turns events back into a stream, for meter.
func dataLines(evs []event) []string {
	var out []string
	for _, e := range evs {
		s := ""
		if e.name != "" {
			s = "event: " + e.name + "\n"
		}
		out = append(out, s+"data: "+e.data+"\n\n")
	}
	return out
}

// Every route must stay under the tightest limit it was given, streaming or not,
// and say why it stopped.
func TestMaxTokensHonoured(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{}))
	cases := []struct {
		path, body string
		want       int
		finish     string
	}{
		{"/v1/chat/completions", chat(`,"max_tokens":3`), 3, "length"},
		{"/v1/chat/completions", chat(`,"max_completion_tokens":2`), 2, "length"},
		{"/v1/chat/completions", chat(`,"max_tokens":5,"max_completion_tokens":4`), 4, "length"},
		{"/v1/chat/completions", chat(`,"max_tokens":0`), 0, "length"},
		{"/v1/chat/completions", chat(`,"max_tokens":8`), 8, "stop"},
		{"/v1/chat/completions", chat(`,"max_tokens":500`), 8, "stop"},
		{"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":3}`, 3, "length"},
		{"/v1/responses", `{"model":"m","input":"abc","max_output_tokens":3}`, 3, "incomplete"},
		{"/v1/responses", `{"model":"m","input":"abc"}`, 8, "completed"},
		{"/v1/messages", `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"abc"}]}`, 3, "max_tokens"},
		{"/v1/messages", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"abc"}]}`, 0, "max_tokens"},
		{"/v1/messages", `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"abc"}]}`, 8, "end_turn"},
	}
	for _, c := range cases {
		for _, stream := range []bool{false, true} {
			body := c.body
			if stream {
				body = strings.TrimSuffix(body, "}") + `,"stream":true,"stream_options":{"include_usage":true}}`
			}
			resp := call(t, ts, c.path, body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: status %d", c.path, body, resp.StatusCode)
			}
			r := meter(t, c.path, stream, readAll(t, resp))
			want := fakellm.CompletionTokens([]byte(body), fakellm.DefaultChunks)
			if want != int64(c.want) {
				t.Errorf("%s: CompletionTokens = %d, want %d", body, want, c.want)
			}
			if !r.usage || r.output != want || r.prompt != fakellm.PromptTokens([]byte(body)) || r.text != words(c.want) || r.finish != c.finish {
				t.Errorf("%s stream=%v: got %+v, want output %d finish %q", c.path, stream, r, want, c.finish)
			}
		}
	}
}

func TestBadRequests(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{}))
	cases := []struct {
		path, body string
		headers    []string
	}{
		{"/v1/chat/completions", chat(`,"max_tokens":-1`), nil},
		{"/v1/chat/completions", chat(`,"max_tokens":1.5`), nil},
		{"/v1/chat/completions", `{"messages":[`, nil},
		{"/v1/chat/completions", chat(""), []string{fakellm.HeaderChunks, "-1"}},
		{"/v1/chat/completions", chat(""), []string{fakellm.HeaderChunks, "many"}},
		{"/v1/chat/completions", chat(""), []string{fakellm.HeaderLatency, "5"}},
		{"/v1/chat/completions", chat(""), []string{fakellm.HeaderUsage, "sometimes"}},
		{"/v1/chat/completions", chat(""), []string{fakellm.HeaderStatus, "200"}},
		{"/v1/chat/completions", chat(""), []string{fakellm.HeaderSplit, "1,x"}},
		{"/v1/chat/completions", chat(""), []string{fakellm.HeaderPromptTokens, "-3"}},
		{"/v1/chat/completions", chat(""), []string{fakellm.HeaderReplay, "x.sse"}}, // replay disabled
	}
	for _, c := range cases {
		resp := call(t, ts, c.path, c.body, c.headers...)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusBadRequest || gjson.Get(body, "error.message").Str == "" {
			t.Errorf("%s %v: %d %s", c.body, c.headers, resp.StatusCode, body)
		}
	}
}

func TestIncludeUsage(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{Chunks: 4}))
	withUsage := chat(`,"stream":true,"stream_options":{"include_usage":true}`)
	without := chat(`,"stream":true`)
	cases := []struct {
		name, path, body, mode string
		want                   bool
	}{
		{"asked", "/v1/chat/completions", withUsage, "", true},
		{"not asked", "/v1/chat/completions", without, "", false},
		{"asked but off", "/v1/chat/completions", withUsage, "off", false},
		{"always", "/v1/chat/completions", without, "always", true},
		{"legacy asked", "/v1/completions", `{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`, "on", true},
		{"legacy not asked", "/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, "", false},
	}
	for _, c := range cases {
		evs := parseSSE(t, readAll(t, call(t, ts, c.path, c.body, fakellm.HeaderUsage, c.mode)))
		last := gjson.Parse(evs[len(evs)-2].data) // the event before [DONE]
		got := last.Get("usage").IsObject()
		if got != c.want {
			t.Fatalf("%s: usage chunk = %v, want %v: %s", c.name, got, c.want, last.Raw)
		}
		if !got {
			continue
		}
		if n := len(last.Get("choices").Array()); n != 0 {
			t.Errorf("%s: usage chunk has %d choices", c.name, n)
		}
		u := last.Get("usage")
		p := fakellm.PromptTokens([]byte(c.body))
		if u.Get("prompt_tokens").Int() != p || u.Get("completion_tokens").Int() != 4 ||
			u.Get("total_tokens").Int() != p+4 || !u.Get("prompt_tokens_details.cached_tokens").Exists() {
			t.Errorf("%s: usage %s, want prompt %d completion 4", c.name, u.Raw, p)
		}
		// Like OpenAI: once usage is on, the other chunks say "usage":null.
		for _, ev := range evs[:len(evs)-2] {
			if u := gjson.Get(ev.data, "usage"); u.Type != gjson.Null || !u.Exists() {
				t.Errorf("%s: chunk before the usage chunk has usage %q", c.name, u.Raw)
			}
		}
	}

	// Non-streaming answers carry usage unless it is off, and the override
	// replaces the estimate.
	r := meter(t, "/v1/chat/completions", false, readAll(t, call(t, ts, "/v1/chat/completions", chat(""), fakellm.HeaderPromptTokens, "1234")))
	if !r.usage || r.prompt != 1234 || r.output != 4 {
		t.Errorf("non-stream: %+v", r)
	}
	body := readAll(t, call(t, ts, "/v1/chat/completions", chat(""), fakellm.HeaderUsage, "off"))
	if gjson.Get(body, "usage").Exists() {
		t.Errorf("usage off: %s", body)
	}
}

func TestUsageEveryChunk(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{Chunks: 5}))
	body := chat(`,"stream":true`)
	evs := parseSSE(t, readAll(t, call(t, ts, "/v1/chat/completions", body, fakellm.HeaderUsage, "every-chunk")))
	p := fakellm.PromptTokens([]byte(body))
	// role chunk (0 tokens so far), 5 content chunks (1..5), finish chunk (5), [DONE]; no usage-only chunk
	want := []int64{0, 1, 2, 3, 4, 5, 5}
	if len(evs) != len(want)+1 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("%d events: %v", len(evs), evs)
	}
	for i, w := range want {
		v := gjson.Parse(evs[i].data)
		u := v.Get("usage")
		if u.Get("completion_tokens").Int() != w || u.Get("prompt_tokens").Int() != p || u.Get("total_tokens").Int() != p+w {
			t.Errorf("chunk %d: usage %s, want completion %d", i, u.Raw, w)
		}
		if len(v.Get("choices").Array()) != 1 {
			t.Errorf("chunk %d has no choice: %s", i, evs[i].data)
		}
	}
}

func TestErrorAfter(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{Chunks: 5}))
	for _, c := range []struct {
		path, body string
		after      int
		wantText   int
	}{
		{"/v1/chat/completions", chat(`,"stream":true,"stream_options":{"include_usage":true}`), 2, 2},
		{"/v1/chat/completions", chat(`,"stream":true`), 0, 0},
		{"/v1/chat/completions", chat(`,"stream":true`), 9, 5}, // past the end: instead of the finish
		{"/v1/completions", `{"prompt":"x","stream":true}`, 3, 3},
		{"/v1/responses", `{"input":"x","stream":true}`, 2, 2},
		{"/v1/messages", `{"max_tokens":50,"messages":[],"stream":true}`, 2, 2},
	} {
		resp := call(t, ts, c.path, c.body, fakellm.HeaderErrorAfter, strconv.Itoa(c.after))
		raw := readAll(t, resp) // the stream ends cleanly, only early
		r := meter(t, c.path, true, raw)
		if !r.errored || r.text != words(c.wantText) || r.done {
			t.Errorf("%s after %d: %+v", c.path, c.after, r)
		}
		if c.path == "/v1/chat/completions" && !strings.HasSuffix(raw, "data: {\"error\":{\"message\":\"fake upstream error\",\"type\":\"server_error\"}}\n\n") {
			t.Errorf("chat error event: %q", raw)
		}
		if r.usage && c.path != "/v1/messages" {
			t.Errorf("%s: usage reported on a failed stream: %+v", c.path, r)
		}
	}
	// Without streaming the failure is a 500.
	resp := call(t, ts, "/v1/chat/completions", chat(""), fakellm.HeaderErrorAfter, "2")
	if body := readAll(t, resp); resp.StatusCode != 500 || gjson.Get(body, "error.type").Str != "server_error" {
		t.Errorf("non-stream error: %d %s", resp.StatusCode, body)
	}
}

func TestDropAfter(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{Chunks: 5}))
	for _, path := range []string{"/v1/chat/completions", "/v1/messages", "/v1/responses"} {
		resp := call(t, ts, path, `{"stream":true,"max_tokens":99,"messages":[{"role":"user","content":"x"}]}`, fakellm.HeaderDropAfter, "2")
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%s: read error %v, want unexpected EOF", path, err)
		}
		// Everything before the drop was delivered: two content chunks.
		if !strings.Contains(string(got), "tok1 ") || !strings.Contains(string(got), "tok2 ") || strings.Contains(string(got), "tok3 ") {
			t.Errorf("%s: delivered %q", path, got)
		}
	}
	// Without streaming the connection closes before any answer.
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(chat("")))
	req.Header.Set(fakellm.HeaderDropAfter, "0")
	if resp, err := ts.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("non-stream drop answered %d", resp.StatusCode)
	}
}

func TestStatus(t *testing.T) {
	s := fakellm.New(fakellm.Config{})
	ts := start(t, s)
	resp := call(t, ts, "/v1/chat/completions", chat(`,"stream":true`), fakellm.HeaderStatus, "429")
	body := readAll(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || gjson.Get(body, "error.type").Str != "rate_limit_error" {
		t.Errorf("429: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	resp = call(t, ts, "/v1/messages", `{"messages":[]}`, fakellm.HeaderStatus, "529")
	body = readAll(t, resp)
	if resp.StatusCode != 529 || gjson.Get(body, "type").Str != "error" || gjson.Get(body, "error.type").Str != "overloaded_error" {
		t.Errorf("529: %d %s", resp.StatusCode, body)
	}
	resp = call(t, ts, "/v1/responses", `{}`, fakellm.HeaderStatus, "500")
	body = readAll(t, resp)
	if resp.StatusCode != 500 || gjson.Get(body, "error.type").Str != "server_error" {
		t.Errorf("500: %d %s", resp.StatusCode, body)
	}
	if s.Calls() != 3 {
		t.Errorf("Calls = %d, want 3: failed calls count too", s.Calls())
	}
}

func TestAuth(t *testing.T) {
	s := fakellm.New(fakellm.Config{APIKey: "sk-up"})
	ts := start(t, s)
	cases := []struct {
		path    string
		headers []string
		want    int
	}{
		{"/v1/chat/completions", nil, 401},
		{"/v1/chat/completions", []string{"Authorization", "Bearer sk-other"}, 401},
		{"/v1/chat/completions", []string{"Authorization", "sk-up"}, 401},
		{"/v1/chat/completions", []string{"x-api-key", "sk-up"}, 401},
		{"/v1/chat/completions", []string{"Authorization", "Bearer sk-up"}, 200},
		{"/v1/embeddings", []string{"Authorization", "Bearer sk-up"}, 200},
		{"/v1/messages", []string{"Authorization", "Bearer sk-up"}, 401},
		{"/v1/messages", []string{"x-api-key", "sk-up"}, 200},
		{"/v1/messages", []string{"x-api-key", "sk-up", "anthropic-version", ""}, 400},
	}
	for _, c := range cases {
		resp := call(t, ts, c.path, `{"input":"x","messages":[]}`, c.headers...)
		body := readAll(t, resp)
		if resp.StatusCode != c.want {
			t.Errorf("%s %v: %d %s, want %d", c.path, c.headers, resp.StatusCode, body, c.want)
		}
		if c.want != 200 && c.path == "/v1/messages" && gjson.Get(body, "type").Str != "error" {
			t.Errorf("%s: not an Anthropic error: %s", c.path, body)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, ts.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer sk-up")
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 200 || !gjson.Get(body, "data.0.id").Exists() {
		t.Errorf("/v1/models: %d %s", resp.StatusCode, body)
	}
}

// Calls counts model requests, once each, concurrent or not, and nothing else.
func TestCalls(t *testing.T) {
	s := fakellm.New(fakellm.Config{})
	ts := start(t, s)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			resp, err := ts.Client().Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(chat(`,"stream":true`)))
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	for _, p := range []string{"/healthz", "/v1/models", "/stats"} {
		resp, err := ts.Client().Get(ts.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
		if p == "/stats" && gjson.Get(body, "calls").Int() != 50 {
			t.Errorf("/stats = %s, want 50 calls", body)
		}
	}
	if s.Calls() != 50 {
		t.Errorf("Calls = %d, want 50", s.Calls())
	}
	s.ResetCalls()
	if s.Calls() != 0 {
		t.Errorf("after reset: %d", s.Calls())
	}
}

func TestAnthropicShape(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{Chunks: 3}))
	body := `{"model":"claude-sonnet-4-5","max_tokens":100,"system":"sys","messages":[{"role":"user","content":"hello"}],"stream":true}`
	resp := call(t, ts, "/v1/messages", body)
	evs := parseSSE(t, readAll(t, resp))
	var names []string
	for _, e := range evs {
		names = append(names, e.name)
	}
	want := "message_start content_block_start ping content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(names, " ") != want {
		t.Fatalf("events %v", names)
	}
	start := gjson.Parse(evs[0].data)
	p := fakellm.PromptTokens([]byte(body))
	if start.Get("message.usage.input_tokens").Int() != p || start.Get("message.usage.output_tokens").Int() != 1 ||
		start.Get("message.model").Str != "claude-sonnet-4-5" || start.Get("message.role").Str != "assistant" {
		t.Errorf("message_start: %s", evs[0].data)
	}
	if d := gjson.Parse(evs[7].data); d.Get("usage.output_tokens").Int() != 3 || d.Get("delta.stop_reason").Str != "end_turn" {
		t.Errorf("message_delta: %s", evs[7].data)
	}

	resp = call(t, ts, "/v1/messages", strings.Replace(body, `,"stream":true`, "", 1))
	v := gjson.Parse(readAll(t, resp))
	if v.Get("type").Str != "message" || v.Get("content.0.type").Str != "text" || v.Get("content.0.text").Str != words(3) ||
		v.Get("usage.input_tokens").Int() != p || v.Get("usage.output_tokens").Int() != 3 || v.Get("usage.cache_read_input_tokens").Int() != 0 {
		t.Errorf("message: %s", v.Raw)
	}
}

func TestResponsesShape(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{Chunks: 2}))
	body := `{"model":"gpt-5","instructions":"be kind","input":[{"role":"user","content":"hi"}],"stream":true}`
	evs := parseSSE(t, readAll(t, call(t, ts, "/v1/responses", body)))
	var names []string
	for i, e := range evs {
		names = append(names, e.name)
		if seq := gjson.Get(e.data, "sequence_number").Int(); seq != int64(i) {
			t.Errorf("event %d (%s): sequence_number %d", i, e.name, seq)
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.done response.content_part.done " +
		"response.output_item.done response.completed"
	if strings.Join(names, " ") != want {
		t.Fatalf("events %v", names)
	}
	done := gjson.Get(evs[len(evs)-1].data, "response")
	p := fakellm.PromptTokens([]byte(body))
	u := done.Get("usage")
	if u.Get("input_tokens").Int() != p || u.Get("output_tokens").Int() != 2 || u.Get("total_tokens").Int() != p+2 ||
		!u.Get("input_tokens_details.cached_tokens").Exists() || done.Get("output.0.content.0.text").Str != words(2) {
		t.Errorf("response.completed: %s", done.Raw)
	}
	if created := gjson.Get(evs[0].data, "response.usage"); created.Type != gjson.Null {
		t.Errorf("usage before completion: %s", created.Raw)
	}

	v := gjson.Parse(readAll(t, call(t, ts, "/v1/responses", strings.Replace(body, `,"stream":true`, "", 1))))
	if v.Get("object").Str != "response" || v.Get("status").Str != "completed" || v.Get("usage.output_tokens").Int() != 2 ||
		v.Get("output.0.content.0.type").Str != "output_text" {
		t.Errorf("response: %s", v.Raw)
	}
}

func TestEmbeddings(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{}))
	body := `{"model":"text-embedding-3-small","input":["one","two","three"]}`
	raw := readAll(t, call(t, ts, "/v1/embeddings", body))
	if !gjson.Valid(raw) {
		t.Fatalf("not JSON: %s", raw)
	}
	v := gjson.Parse(raw)
	if n := len(v.Get("data").Array()); n != 3 {
		t.Fatalf("%d embeddings: %s", n, v.Raw)
	}
	p := fakellm.PromptTokens([]byte(body))
	if v.Get("usage.prompt_tokens").Int() != p || v.Get("usage.total_tokens").Int() != p || v.Get("usage.completion_tokens").Exists() {
		t.Errorf("usage: %s", v.Get("usage").Raw)
	}
	v = gjson.Parse(readAll(t, call(t, ts, "/v1/embeddings", `{"input":"x","encoding_format":"base64","dimensions":16}`)))
	vec, err := base64.StdEncoding.DecodeString(v.Get("data.0.embedding").Str)
	if err != nil || len(vec) != 16*4 {
		t.Errorf("base64 embedding: %v, %d bytes", err, len(vec))
	}
}

// The same request gets the same bytes, so whole responses can be compared.
func TestDeterministic(t *testing.T) {
	ts := start(t, fakellm.New(fakellm.Config{}))
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"} {
		for _, stream := range []string{"false", "true"} {
			body := `{"model":"m","input":"a","prompt":"b","messages":[],"stream":` + stream + `}`
			a := readAll(t, call(t, ts, path, body))
			b := readAll(t, call(t, ts, path, body))
			if a != b {
				t.Errorf("%s stream=%s differs:\n%s\n%s", path, stream, a, b)
			}
		}
	}
}

func BenchmarkChatStream(b *testing.B) {
	ts := httptest.NewServer(fakellm.New(fakellm.Config{}))
	defer ts.Close()
	tr := ts.Client().Transport.(*http.Transport)
	tr.MaxIdleConnsPerHost = 512
	body := chat(`,"stream":true,"stream_options":{"include_usage":true}`)
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := ts.Client().Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
