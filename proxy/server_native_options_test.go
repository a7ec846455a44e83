package proxy_test

import (
	"net/http"
	"testing"
)

// TestServerNativeBoundAndChoiceFieldsAreRefused: llama.cpp's server, an OpenAI-compatible
// upstream, copies every body field onto its own request and reads its native names first:
// `n_predict` bounds the output before `max_completion_tokens` and `max_tokens` (-1: no bound),
// and `n_cmpl` asks for that many completions before `n`. Forwarded, `"max_tokens": 16,
// "n_predict": -1` was held, bounded and charged as 16 tokens of output while the server wrote
// to its context's end, and `"n_cmpl": 4` as one answer while it wrote four, each up to the
// bound: past the cap, clamped to it, unpaid. (The gateway's own lowering of max_tokens to fit
// the cap did nothing either.) They are refused with 400 unsupported_parameter before anything
// is held, on every route; null (unset, as the server reads it) is served.
func TestServerNativeBoundAndChoiceFieldsAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	refused := []struct{ name, path, body string }{
		{"n_predict unbounded", "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":16,"n_predict":-1,"messages":[{"role":"user","content":"hi"}]}`},
		{"n_predict alone", "/v1/chat/completions", `{"model":"fake-gpt","n_predict":100000,"messages":[{"role":"user","content":"hi"}]}`},
		{"n_cmpl", "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":16,"n_cmpl":4,"messages":[{"role":"user","content":"hi"}]}`},
		{"completions n_predict", "/v1/completions", `{"model":"fake-gpt","max_tokens":16,"n_predict":100000,"prompt":"hi"}`},
		{"completions n_cmpl", "/v1/completions", `{"model":"fake-gpt","n":1,"n_cmpl":8,"prompt":"hi"}`},
		{"responses n_predict", "/v1/responses", `{"model":"fake-gpt","max_output_tokens":16,"n_predict":100000,"input":"hi"}`},
		{"messages n_predict", "/v1/messages", `{"model":"claude-test","max_tokens":16,"n_predict":100000,"messages":[{"role":"user","content":"hi"}]}`},
		{"another case", "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":16,"N_Predict":100000,"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			code := "unsupported_parameter"
			if tc.name == "another case" {
				code = "invalid_json" // a spelling of a key the gateway reads
			}
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, code)
		})
	}
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","n_predict":null,"n_cmpl":null,"messages":[{"role":"user","content":"hi"}]}`, nil) // the fields set to null
}
