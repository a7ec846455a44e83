package proxy_test

import (
	"net/http"
	"testing"
)

// TestRouterPaidPDFEngineIsRefused: OpenRouter's file-parser plugin with its "mistral-ocr"
// engine bills each page it reads (2 USD per 1 000) on top of the tokens, which the gateway
// charged at the model's token prices alone. It is refused with 400 unpriced_option before
// anything is held; the free engines are served.
func TestRouterPaidPDFEngineIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, engine := range []string{"mistral-ocr", " Mistral-OCR"} {
		t.Run(engine, func(t *testing.T) {
			h.postRefused(t, key, "/v1/chat/completions", `{"model":"fake-gpt","plugins":[{"id":"file-parser","pdf":{"engine":"`+engine+`"}}],"messages":[{"role":"user","content":"hi"}]}`,
				nil, http.StatusBadRequest, "unpriced_option")
		})
	}
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","plugins":[{"id":"file-parser","pdf":{"engine":"cloudflare-ai"}}],"messages":[{"role":"user","content":"hi"}]}`, nil) // a free engine
}
