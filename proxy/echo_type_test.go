package proxy_test

import (
	"net/http"
	"testing"
)

// TestNonBooleanEchoIsRefused: a /v1/completions call's echo answers each choice with its
// prompt first, which the provider bills as input and the gateway leaves out of the output's
// estimate. A string or number echo ("true", 1) was read here as no echo, while servers built
// on pydantic (vLLM's) read it as true and echo: with no usage, the echoed prompt was charged
// again as output, at the output price. It is refused 400 invalid_echo before anything is
// held, as a stream that is no boolean is; a boolean or null is served.
func TestNonBooleanEchoIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, echo := range []string{`"true"`, `1`, `"false"`, `{}`} {
		t.Run(echo, func(t *testing.T) {
			h.postRefused(t, key, "/v1/completions", `{"model":"fake-gpt","max_tokens":16,"echo":`+echo+`,"prompt":"hi"}`, nil,
				http.StatusBadRequest, "invalid_echo")
		})
	}
	for _, echo := range []string{`true`, `false`, `null`} {
		resp := h.post(key, "/v1/completions", `{"model":"fake-gpt","max_tokens":16,"echo":`+echo+`,"prompt":"hi"}`, nil)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("echo %s: %d %s, want 200", echo, resp.StatusCode, body)
		}
	}
}
