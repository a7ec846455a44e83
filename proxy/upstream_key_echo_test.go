package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
)

// TestAnthropicUpstreamKeyEchoIsRedacted: an Anthropic upstream (whose key travels in
// x-api-key) that quotes the key it was sent in its error answer — a 4xx passed on to the
// caller, a 401 that is not — has it replaced by "(redacted)" in the answer and in every log
// line, as an OpenAI-style one does (e2e/secrets_test.go); the operator's account id in its
// words goes too.
func TestAnthropicUpstreamKeyEchoIsRedacted(t *testing.T) {
	const opKey = "sk-ant-api03-operatorsecret0123456789"
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusBadRequest
		if r.Header.Get("X-Echo-Status") == "401" {
			status = http.StatusUnauthorized
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"type":"error","error":{"type":"invalid_request_error","message":"bad x-api-key %s for the rate limit of your organization (0dccdde6-1234-4321-abcd-0123456789ab)"}}`,
			r.Header.Get("X-Api-Key"))
	}))
	t.Cleanup(echo.Close)
	core, logs := observer.New(zapcore.DebugLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, func(c *config.Config) {
		for i := range c.Upstreams {
			if c.Upstreams[i].Kind == "anthropic" {
				c.Upstreams[i].BaseURL, c.Upstreams[i].APIKey = echo.URL, opKey
			}
		}
	})
	_, key := h.user("standard")
	body := `{"model":"claude-test","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	for _, st := range []string{"400", "401"} {
		req := h.newRequest("", "/v1/messages", body, map[string]string{"X-Api-Key": key, "X-Echo-Status": st})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "operatorsecret") || strings.Contains(string(b), "0dccdde6") {
			t.Errorf("upstream %s: the answer names the operator's key or organisation: %s", st, b)
		}
		if st == "400" && (resp.StatusCode != 400 || !strings.Contains(string(b), "bad x-api-key (redacted)")) {
			t.Errorf("upstream 400: %d %s, want it passed on with the key redacted", resp.StatusCode, b)
		}
	}
	h.settled()
	for _, e := range logs.All() {
		line := fmt.Sprint(e.Message, e.ContextMap())
		if strings.Contains(line, "operatorsecret") {
			t.Errorf("a log line holds the operator's key: %s", line)
		}
		if strings.Contains(line, key[:11]) {
			t.Errorf("a log line holds the caller's key: %s", line)
		}
	}
}

// TestStreamKeyEchoAfterTheErrorEventIsRedacted: a Responses stream ends with the provider's
// error event and then response.failed, which repeats the error's words (response.error). Both
// may echo the operator's key (a router that quotes the request's Authorization in its errors):
// the first event was redacted, the second relayed as sent, so the caller read the key in it —
// in a plain call and in a named run's (whose end is held until the call is tallied).
func TestStreamKeyEchoAfterTheErrorEventIsRedacted(t *testing.T) {
	const opKey = "sk-proj-operatorsecret0123456789abcdef"
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n")
		fmt.Fprintf(w, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"server_error\",\"code\":\"server_error\",\"message\":\"key %s refused\"}}\n\n", auth)
		fmt.Fprintf(w, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"key %s refused\"},\"usage\":null}}\n\n", auth)
	}))
	t.Cleanup(echo.Close)
	core, logs := observer.New(zapcore.DebugLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "resp", Kind: "openai", BaseURL: echo.URL, APIKey: opKey, Models: []string{"*"}}}
	})
	_, key := h.user("standard")
	for name, hdr := range map[string]map[string]string{"plain": nil, "named run": {"X-Run-Id": "run-echo-1"}} {
		resp := h.post(key, "/v1/responses", `{"model":"fake-gpt","input":"hi","stream":true}`, hdr)
		b := readAll(t, resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "operatorsecret") {
			t.Errorf("%s: the stream names the operator's key after its error event:\n%s", name, b)
		}
		if !strings.Contains(string(b), "response.failed") {
			t.Errorf("%s: the stream lacks response.failed:\n%s", name, b)
		}
	}
	h.settled()
	for _, e := range logs.All() {
		if line := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(line, "operatorsecret") {
			t.Errorf("a log line holds the operator's key: %s", line)
		}
	}
}

// TestUpstreamKeyEchoInAHeaderIsRedacted: a router or debugging proxy in front of the provider
// that quotes the request's Authorization in a header of its answer (a 4xx passed on, a 200, a
// stream) had it relayed to the caller with the answer's other headers: the operator's key is
// redacted there as it is in the body.
func TestUpstreamKeyEchoInAHeaderIsRedacted(t *testing.T) {
	const opKey = "sk-proj-operatorsecret0123456789abcdef"
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo-Authorization", r.Header.Get("Authorization"))
		switch r.Header.Get("X-Echo-Mode") {
		case "400":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"type":"invalid_request_error","code":"bad","message":"bad request"}}`)
		case "stream":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
			fmt.Fprint(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"c1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
		}
	}))
	t.Cleanup(echo.Close)
	h := newHarnessOn(t, harnessSetup{}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "echo", Kind: "openai", BaseURL: echo.URL, APIKey: opKey, Models: []string{"*"}}}
	})
	_, key := h.user("standard")
	for _, mode := range []string{"400", "200", "stream"} {
		body := `{"model":"fake-gpt","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
		if mode == "stream" {
			body = `{"model":"fake-gpt","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
		}
		resp := h.post(key, "/v1/chat/completions", body, map[string]string{"X-Echo-Mode": mode})
		readAll(t, resp.Body)
		resp.Body.Close()
		for k, vv := range resp.Header {
			if strings.Contains(strings.Join(vv, " "), "operatorsecret") {
				t.Errorf("%s (%d): header %s names the operator's key: %q", mode, resp.StatusCode, k, vv)
			}
		}
	}
	h.settled()
}

// TestStreamKeyEchoOutsideAnErrorEventIsRedacted: an upstream (a proxy on the way, a server
// behind a router) that answers a stream under the event-stream label with words that are no
// error event — a page, a line of text — quoting the operator's key had them relayed as sent:
// only an event the meter read as the provider's error was redacted. Every event relayed is.
func TestStreamKeyEchoOutsideAnErrorEventIsRedacted(t *testing.T) {
	const opKey = "sk-proj-operatorsecret0123456789abcdef"
	for name, body := range map[string]string{
		"page": "<html><body>bad key %s</body></html>",
		"text": "upstream connect error: bad key %s",
		"comment after a chunk": "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" +
			": routed with key %s\n\ndata: [DONE]\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprintf(w, body, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
			}))
			t.Cleanup(echo.Close)
			h := newHarnessOn(t, harnessSetup{}, func(c *config.Config) {
				c.Upstreams = []config.Upstream{{Name: "echo", Kind: "openai", BaseURL: echo.URL, APIKey: opKey, Models: []string{"*"}}}
			})
			_, key := h.user("standard")
			resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
			b := readAll(t, resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), "operatorsecret") {
				t.Errorf("%d: the stream names the operator's key:\n%s", resp.StatusCode, b)
			}
			h.settled()
		})
	}
}
