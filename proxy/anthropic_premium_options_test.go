package proxy_test

import (
	"net/http"
	"testing"
)

// TestAnthropicFastModeUSInferenceAndAdvisorAreRefusedAsUnpriced: Anthropic bills a
// /v1/messages call at more than the model's token prices when it asks for fast mode
// (`speed: "fast"`, a multiple of the standard rates), US-only inference (`inference_geo:
// "us"`, 1.1× every token) or the advisor tool (the advisor's tokens at the advisor model's
// rates, a dearer model than the one asked for). Forwarded, each was charged at the asked
// model's token prices and the difference fell on the operator. Such a request is refused with
// 400 unpriced_option before anything is held or forwarded, a key spelled in another case
// (which a provider folding keys reads as the same) is refused too, and the standard values
// are served.
func TestAnthropicFastModeUSInferenceAndAdvisorAreRefusedAsUnpriced(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	const messages = "/v1/messages"
	refused := []struct {
		name, body, code string
		header           map[string]string
	}{
		{"fast mode", `{"model":"claude-test","max_tokens":50,"speed":"fast","messages":[{"role":"user","content":"hi"}]}`,
			"unpriced_option", map[string]string{"Anthropic-Beta": "fast-mode-2026-02-01"}},
		{"fast mode, key escaped", `{"model":"claude-test","max_tokens":50,"sp\u0065ed":"fast","messages":[{"role":"user","content":"hi"}]}`,
			"unpriced_option", nil},
		{"fast mode, key in another case", `{"model":"claude-test","max_tokens":50,"Speed":"fast","messages":[{"role":"user","content":"hi"}]}`,
			"invalid_json", nil},
		{"US-only inference", `{"model":"claude-test","max_tokens":50,"inference_geo":"us","messages":[{"role":"user","content":"hi"}]}`,
			"unpriced_option", nil},
		{"US-only inference, key in another case", `{"model":"claude-test","max_tokens":50,"Inference_Geo":"us","messages":[{"role":"user","content":"hi"}]}`,
			"invalid_json", nil},
		{"advisor tool", `{"model":"claude-test","max_tokens":50,"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6"}],"messages":[{"role":"user","content":"hi"}]}`,
			"unpriced_option", map[string]string{"Anthropic-Beta": "advisor-tool-2026-03-01"}},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, messages, tc.body, tc.header, http.StatusBadRequest, tc.code)
		})
	}
	served := []struct{ name, body string }{
		{"standard speed", `{"model":"claude-test","max_tokens":50,"speed":"standard","messages":[{"role":"user","content":"hi"}]}`},
		{"null speed and geo", `{"model":"claude-test","max_tokens":50,"speed":null,"inference_geo":null,"messages":[{"role":"user","content":"hi"}]}`},
		{"global inference", `{"model":"claude-test","max_tokens":50,"inference_geo":"global","messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range served {
		t.Run("served/"+tc.name, func(t *testing.T) {
			h.postOK(t, key, messages, tc.body, nil)
		})
	}
}
