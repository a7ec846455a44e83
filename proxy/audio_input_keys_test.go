package proxy_test

import (
	"net/http"
	"testing"
)

// TestAudioInputUnderFoldedListKeyRefused: the audio refusal looks for input_audio parts under
// "messages" (chat) and "input" (Responses), spelled exactly so, while it compares the keys
// inside them ("content", "type") with case folded, as a Go-based OpenAI-compatible provider
// (encoding/json) reads them. Such a provider reads "Messages" or "meſſages" (U+017F) alone as
// the messages too: the clip reached a model without an audio price and its audio tokens were
// billed at the text price.
func TestAudioInputUnderFoldedListKeyRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	const part = `[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]`
	for _, tc := range []struct{ name, path, body string }{
		{"Messages", "/v1/chat/completions", `{"model":"fake-gpt","Messages":` + part + `}`},
		{"long s messages", "/v1/chat/completions", `{"model":"fake-gpt","meſſages":` + part + `}`},
		{"Input", "/v1/responses", `{"model":"fake-gpt","Input":` + part + `}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "")
		})
	}
}
