package proxy_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// shapedError is an error body read both ways: Anthropic's top-level "type":"error", and the
// error object both shapes share.
type shapedError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
		Code    string `json:"code"`
	} `json:"error"`
}

func readShapedError(t *testing.T, what string, resp *http.Response) shapedError {
	t.Helper()
	defer resp.Body.Close()
	b := readAll(t, resp.Body)
	var e shapedError
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("%s: not an error body: %s", what, b)
	}
	return e
}

// Anthropic's clients read an error by its top-level "type":"error" and name its class by
// error.type, whose values differ from OpenAI's for the same status (billing_error, not
// insufficient_quota). The gateway's own code rides along; OpenAI routes keep OpenAI's shape.
func TestAnthropicRouteErrorsHaveAnthropicShape(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.AllowanceCredits = config.CreditsOf(0)
		c.Plans["broke"] = p
		c.Limits.MaxBodyBytes = 4096
	})
	_, key := h.user("standard")
	_, brokeKey := h.user("broke")
	msg := `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	get := func(path string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, h.gw.URL+path, nil)
		req.Header.Set("x-api-key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, tc := range []struct {
		name          string
		resp          func() *http.Response
		status        int
		anthropicType string // "" for OpenAI's shape
		errType, code string
	}{
		{"401", func() *http.Response { return h.post("", "/v1/messages", msg, map[string]string{"x-api-key": "nope"}) },
			401, "error", "authentication_error", "invalid_api_key"},
		{"400", func() *http.Response { return h.post(key, "/v1/messages", "{", nil) },
			400, "error", "invalid_request_error", "invalid_json"},
		{"402", func() *http.Response { return h.post(brokeKey, "/v1/messages", msg, nil) },
			402, "error", "billing_error", "insufficient_credits"},
		{"404 under the route", func() *http.Response { return h.post(key, "/v1/messages/batches", msg, nil) },
			404, "error", "not_found_error", "not_found"},
		{"405", func() *http.Response { return get("/v1/messages") },
			405, "error", "invalid_request_error", "method_not_allowed"},
		{"413", func() *http.Response {
			return h.post(key, "/v1/messages", `{"model":"claude-test","pad":"`+strings.Repeat("x", 8192)+`"}`, nil)
		}, 413, "error", "request_too_large", "request_too_large"},
		{"OpenAI route 402", func() *http.Response {
			return h.post(brokeKey, "/v1/chat/completions", chatBody, nil)
		}, 402, "", "insufficient_quota", "insufficient_credits"},
		{"OpenAI route 401", func() *http.Response { return h.post("nope", "/v1/chat/completions", `{}`, nil) },
			401, "", "authentication_error", "invalid_api_key"},
	} {
		resp := tc.resp()
		e := readShapedError(t, tc.name, resp)
		if resp.StatusCode != tc.status || e.Type != tc.anthropicType || e.Error.Type != tc.errType || e.Error.Code != tc.code {
			t.Errorf("%s: got %d type %q error.type %q code %q; want %d %q %q %q", tc.name, resp.StatusCode,
				e.Type, e.Error.Type, e.Error.Code, tc.status, tc.anthropicType, tc.errType, tc.code)
		}
	}
}

// An error once the stream's 200 is sent is an Anthropic error event with Anthropic's type.
func TestAnthropicStreamErrorEventHasAnthropicType(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/messages", `{"model":"claude-test","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{fakellm.HeaderChunks: "9", fakellm.HeaderDropAfter: "3"})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var data string
	for prev := ""; sc.Scan(); prev = sc.Text() {
		if prev == "event: error" {
			data = strings.TrimPrefix(sc.Text(), "data: ")
		}
	}
	var e shapedError
	if err := json.Unmarshal([]byte(data), &e); err != nil {
		t.Fatalf("no error event at the end of a broken stream (last data %q): %v", data, err)
	}
	if e.Type != "error" || e.Error.Type != "api_error" || e.Error.Code != "upstream_broken" {
		t.Errorf("error event %s: want type error, error.type api_error, code upstream_broken", data)
	}
	h.settled()
}
