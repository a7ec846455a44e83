package proxy_test

import (
	"net/http"
	"testing"
)

// TestRouterRetryAndTimeoutFieldsAreRefused: LiteLLM's proxy reads per-request timeouts and
// retries from the body (`timeout`, `request_timeout`, `stream_timeout`, `num_retries`,
// `max_retries`), and its other fallback lists (`context_window_fallbacks`,
// `content_policy_fallbacks`, maps of a model to the models it falls back to). Forwarded, a
// caller set the router to give up on the call after the provider had it — a non-2xx,
// charged 0 here, the provider billing what it did — or to run it several times, billed once;
// and to fall back to a model whose price was never checked (`fallbacks` and `models` are).
// So is `user_config`, a router configuration of the caller's own that LiteLLM's proxy (before
// it banned the field) built a router from: any model under the name asked, retries, fallbacks;
// and a top-level `model_list`, deployments LiteLLM's completion call runs the request on at once.
// They are refused with 400 unsupported_parameter before anything is held; null (the field
// unset, as clients that write every optional field send it) is served.
func TestRouterRetryAndTimeoutFieldsAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	refused := []struct{ name, path, body string }{
		{"timeout", "/v1/chat/completions", `{"model":"fake-gpt","timeout":0.01,"messages":[{"role":"user","content":"hi"}]}`},
		{"request_timeout", "/v1/chat/completions", `{"model":"fake-gpt","request_timeout":"1","messages":[{"role":"user","content":"hi"}]}`},
		{"stream_timeout", "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"stream_timeout":0.01,"messages":[{"role":"user","content":"hi"}]}`},
		{"num_retries", "/v1/chat/completions", `{"model":"fake-gpt","num_retries":10,"messages":[{"role":"user","content":"hi"}]}`},
		{"max_retries", "/v1/completions", `{"model":"fake-gpt","max_retries":10,"prompt":"hi"}`},
		{"messages timeout", "/v1/messages", `{"model":"claude-test","max_tokens":50,"timeout":1,"messages":[{"role":"user","content":"hi"}]}`},
		{"responses retries", "/v1/responses", `{"model":"fake-gpt","num_retries":3,"input":"hi"}`},
		{"context_window_fallbacks", "/v1/chat/completions", `{"model":"fake-gpt","context_window_fallbacks":[{"fake-gpt":["unpriced-dear"]}],"messages":[{"role":"user","content":"hi"}]}`},
		{"content_policy_fallbacks", "/v1/chat/completions", `{"model":"fake-gpt","content_policy_fallbacks":[{"fake-gpt":["unpriced-dear"]}],"messages":[{"role":"user","content":"hi"}]}`},
		// A router configuration of the caller's own: the model named mapped to another, run
		// at the operator's key, retried and fallen back along as it says.
		{"user_config", "/v1/chat/completions", `{"model":"fake-gpt","user_config":{"model_list":[{"model_name":"fake-gpt","litellm_params":{"model":"unpriced-dear"}}],"num_retries":5,"fallbacks":[{"fake-gpt":["unpriced-dear"]}]},"messages":[{"role":"user","content":"hi"}]}`},
		{"responses user_config", "/v1/responses", `{"model":"fake-gpt","user_config":{"model_list":[{"model_name":"fake-gpt","litellm_params":{"model":"unpriced-dear"}}]},"input":"hi"}`},
		// Deployments of the caller's own, run at once, the first answer kept, each billed.
		{"model_list", "/v1/chat/completions", `{"model":"fake-gpt","model_list":[{"model_name":"fake-gpt","litellm_params":{"model":"unpriced-dear"}},{"model_name":"fake-gpt","litellm_params":{"model":"fake-gpt"}}],"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unsupported_parameter")
		})
	}
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","timeout":null,"num_retries":null,"messages":[{"role":"user","content":"hi"}]}`, nil) // the fields set to null
}

// TestRouterTagRoutingIsRefused: LiteLLM's proxy routes a request by the "tags" of its body
// among the deployments of the model named (its documentation routes "free" and "paid" to two
// different models under one name), the lever the gateway drops from the x-litellm-tags
// header. In the body it was served, billed at the one price of the model named whichever
// deployment ran it. Refused 400 unsupported_parameter before anything is held; null is served.
func TestRouterTagRoutingIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for name, body := range map[string]string{
		"chat list":    `{"model":"fake-gpt","tags":["paid"],"messages":[{"role":"user","content":"hi"}]}`,
		"chat string":  `{"model":"fake-gpt","tags":"paid","messages":[{"role":"user","content":"hi"}]}`,
		"another case": `{"model":"fake-gpt","Tags":["paid"],"messages":[{"role":"user","content":"hi"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			code := "unsupported_parameter"
			if name == "another case" {
				code = "invalid_json"
			}
			h.postRefused(t, key, "/v1/chat/completions", body, nil, http.StatusBadRequest, code)
		})
	}
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","tags":null,"messages":[{"role":"user","content":"hi"}]}`, nil) // tags set to null
}

// TestRouterHeaderFieldsAreRefused: LiteLLM's proxy unpacks a request's body into its
// completion call, which sends the body's "extra_headers" (and "headers") to the provider as
// request headers, unchecked. Every header the gateway keeps from the provider went there that
// way: Google's field mask, which leaves the usage out of the answer (charged the estimate
// alone), Bedrock's and Vertex AI's priority tiers, billed above the price the gateway charges.
// They are refused with 400 unsupported_parameter before anything is held; null or an empty
// object, which adds no header, is served.
func TestRouterHeaderFieldsAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	refused := []struct{ name, path, body string }{
		{"field mask", "/v1/chat/completions", `{"model":"fake-gpt","extra_headers":{"X-Goog-FieldMask":"choices"},"messages":[{"role":"user","content":"hi"}]}`},
		{"bedrock tier", "/v1/chat/completions", `{"model":"fake-gpt","headers":{"X-Amzn-Bedrock-Service-Tier":"priority"},"messages":[{"role":"user","content":"hi"}]}`},
		{"messages vertex tier", "/v1/messages", `{"model":"claude-test","max_tokens":50,"extra_headers":{"X-Vertex-AI-LLM-Shared-Request-Type":"priority"},"messages":[{"role":"user","content":"hi"}]}`},
		{"responses", "/v1/responses", `{"model":"fake-gpt","extra_headers":{"x-litellm-num-retries":"5"},"input":"hi"}`},
		{"not an object", "/v1/chat/completions", `{"model":"fake-gpt","extra_headers":["X-Goog-FieldMask: choices"],"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unsupported_parameter")
		})
	}
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","extra_headers":null,"headers":{},"messages":[{"role":"user","content":"hi"}]}`, nil)
}
