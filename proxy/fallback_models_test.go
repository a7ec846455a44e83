package proxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestFallbackModelsMustAllBePriced: a router (OpenRouter's `models`) answers with the first
// of a list of models that is up, at that model's rates. A fallback the gateway has no price
// for was billed at the asked model's price (an answering model without a price leaves the
// price asked for): a caller could ask a cheap model and name a dear one to fall back to. Such
// a request is refused with 400 unpriced_option before anything is held or forwarded; a list
// whose models are all priced is served (the answer is billed at the model that answered),
// and a `models` that is not a list of names is 400 invalid_models.
func TestFallbackModelsMustAllBePriced(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	refused := []fallbackCase{
		{"unpriced fallback", `{"model":"fake-gpt","models":["fake-gpt","some-dear-model"],"messages":[{"role":"user","content":"hi"}]}`, "unpriced_option"},
		{"unpriced fallback, completions", `{"model":"fake-gpt","models":["some-dear-model"],"prompt":"hi"}`, "unpriced_option"},
		{"not a list", `{"model":"fake-gpt","models":"some-dear-model","messages":[{"role":"user","content":"hi"}]}`, "invalid_models"},
		{"not names", `{"model":"fake-gpt","models":[{"id":"some-dear-model"}],"messages":[{"role":"user","content":"hi"}]}`, "invalid_models"},
		{"too many", `{"model":"fake-gpt","models":[` + strings.Repeat(`"fake-gpt",`, 64) + `"fake-gpt"],"messages":[{"role":"user","content":"hi"}]}`, "invalid_models"},
		{"key in another case", `{"model":"fake-gpt","Models":["some-dear-model"],"messages":[{"role":"user","content":"hi"}]}`, "invalid_json"},
	}
	checkFallbackLists(t, h, key, refused, []string{
		`{"model":"fake-gpt","models":["fake-gpt","claude-test"],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"fake-gpt","models":null,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"fake-gpt","models":[],"messages":[{"role":"user","content":"hi"}]}`,
	})
}

// TestLiteLLMFallbacksMustAllBePriced: LiteLLM's proxy takes a fallback list in the request
// body under its own name, `fallbacks` (and `mock_testing_fallbacks: true` makes it use it),
// and answers with the first model of it that is up, as OpenRouter's `models` does. A
// fallback without a price was billed at the cheap model asked for, and the call's output
// bound reckoned at it; so the list is held to what `models` is.
func TestLiteLLMFallbacksMustAllBePriced(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	refused := []fallbackCase{
		{"unpriced fallback", `{"model":"fake-gpt","fallbacks":["some-dear-model"],"mock_testing_fallbacks":true,"messages":[{"role":"user","content":"hi"}]}`, "unpriced_option"},
		{"unpriced fallback, completions", `{"model":"fake-gpt","fallbacks":["fake-gpt","some-dear-model"],"prompt":"hi"}`, "unpriced_option"},
		{"not a list", `{"model":"fake-gpt","fallbacks":"some-dear-model","messages":[{"role":"user","content":"hi"}]}`, "invalid_models"},
		// LiteLLM's other form, a model with messages of its own (a prompt the estimate
		// would not see), is not served.
		{"not names", `{"model":"fake-gpt","fallbacks":[{"model":"fake-gpt","messages":[{"role":"user","content":"a long prompt"}]}],"messages":[{"role":"user","content":"hi"}]}`, "invalid_models"},
		{"key in another case", `{"model":"fake-gpt","Fallbacks":["some-dear-model"],"messages":[{"role":"user","content":"hi"}]}`, "invalid_json"},
	}
	checkFallbackLists(t, h, key, refused, []string{
		`{"model":"fake-gpt","fallbacks":["fake-gpt","claude-test"],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"fake-gpt","fallbacks":null,"messages":[{"role":"user","content":"hi"}]}`,
	})
}

// fallbackCase is a request with a fallback list refused 400 with code; one named "…,
// completions" is sent to /v1/completions, the rest to /v1/chat/completions.
type fallbackCase struct{ name, body, code string }

// checkFallbackLists sends each refused case, checking that it is refused before anything is
// held or forwarded, and each served body to chat, checking it is answered.
func checkFallbackLists(t *testing.T, h *harness, key string, refused []fallbackCase, served []string) {
	t.Helper()
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			path := "/v1/chat/completions"
			if strings.HasSuffix(tc.name, ", completions") {
				path = "/v1/completions"
			}
			h.postRefused(t, key, path, tc.body, nil, http.StatusBadRequest, tc.code)
		})
	}
	for _, body := range served {
		resp := h.post(key, "/v1/chat/completions", body, nil)
		out := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d %s, want 200", body, resp.StatusCode, out)
		}
	}
}
