package proxy_test

import (
	"net/http"
	"testing"
)

// TestGoogleSystemQueryParametersAreRefused: the caller's query string goes on to the upstream,
// and Google's front end reads system parameters in it on every API it serves, the Gemini
// OpenAI-compatible endpoint among them: `fields` (`$fields`), a field mask that can leave
// `usage` out of the answer (charged the estimate alone, thinking tokens unseen); `alt`
// (`$alt`), whose `proto` answers in protobuf, and `callback` (`$callback`), JSONP — text that
// is neither JSON nor an event stream, which the gateway charges nothing for while the
// provider billed the call. They are refused with 400 unsupported_parameter, before anything is
// held, as X-Goog-FieldMask is dropped, also behind a ';', which some servers split a query
// on; other query parameters (an API version) are served.
func TestGoogleSystemQueryParametersAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, q := range []string{"fields=choices", "%24fields=choices", "$fields=id", "alt=proto", "$alt=proto",
		"api-version=1&callback=f", "%24callback=f", "Fields=choices", "api-version=1;fields=choices"} {
		t.Run(q, func(t *testing.T) {
			h.postRefused(t, key, "/v1/chat/completions?"+q, chatBody, nil, http.StatusBadRequest, "unsupported_parameter")
		})
	}
	resp := h.post(key, "/v1/chat/completions?api-version=2024-06-01", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s, want 200: an API version", resp.StatusCode, body)
	}
}
