package proxy_test

import (
	"net/http"
	"testing"
)

// TestRefusalKeysInAnotherCaseAreRefused: the top-level keys the gateway reads to refuse a
// call billed at rates it has no price for — OpenRouter's "plugins" (its web search), Vercel's
// "providerOptions", the "context-1m" beta in the body ("anthropic_beta", Bedrock's
// "additionalModelRequestFields"), LiteLLM's per-request timeouts and retries — were read
// under their exact spelling alone. A provider or relay that decodes with Go's encoding/json
// matches keys with case folded, so "Plugins" reached it as plugins and ran the web search
// the gateway had not seen; the gateway refuses any other key it reads spelt so (400
// invalid_json), and must refuse these as well, before anything is held.
func TestRefusalKeysInAnotherCaseAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for name, extra := range map[string]string{
		"Plugins":                      `"Plugins":[{"id":"web"}]`,
		"ProviderOptions":              `"ProviderOptions":{"gateway":{"models":["unpriced-model"]}}`,
		"Anthropic_Beta":               `"Anthropic_Beta":["context-1m-2025-08-07"]`,
		"AdditionalModelRequestFields": `"AdditionalModelRequestFields":{"anthropic_beta":["context-1m-2025-08-07"]}`,
		"Timeout":                      `"Timeout":1`,
		"Num_Retries":                  `"Num_Retries":3`,
		"Max_Retries":                  `"Max_Retries":3`,
		"Request_Timeout":              `"Request_Timeout":1`,
		"Stream_Timeout":               `"Stream_Timeout":1`,
		"Context_Window_Fallbacks":     `"Context_Window_Fallbacks":[{"fake-gpt":["unpriced-model"]}]`,
		"Content_Policy_Fallbacks":     `"Content_Policy_Fallbacks":[{"fake-gpt":["unpriced-model"]}]`,
	} {
		t.Run(name, func(t *testing.T) {
			h.postRefused(t, key, "/v1/chat/completions", `{"model":"fake-gpt",`+extra+`,"messages":[{"role":"user","content":"hi"}]}`,
				nil, http.StatusBadRequest, "invalid_json")
		})
	}
}

// TestPluginKeysInAnotherCaseAreRefused: a router plugin entry is read by its "id" (OpenRouter's
// web search, "web") and its "pdf" options' "engine" (the per-page "mistral-ocr"): spelt in
// another case or twice, the gateway read no such plugin while a relay that folds keys, or
// reads the last of repeated ones, ran it. Refused as a tool whose type is ambiguous is.
func TestPluginKeysInAnotherCaseAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for name, plugins := range map[string]string{
		"ID":                `[{"ID":"web"}]`,
		"Pdf":               `[{"id":"file-parser","Pdf":{"engine":"mistral-ocr"}}]`,
		"Engine":            `[{"id":"file-parser","pdf":{"Engine":"mistral-ocr"}}]`,
		"id and Id":         `[{"id":"x","Id":"web"}]`,
		"engine and ENGINE": `[{"id":"file-parser","pdf":{"engine":"pdf-text","ENGINE":"mistral-ocr"}}]`,
	} {
		t.Run(name, func(t *testing.T) {
			h.postRefused(t, key, "/v1/chat/completions", `{"model":"fake-gpt","plugins":`+plugins+`,"messages":[{"role":"user","content":"hi"}]}`,
				nil, http.StatusBadRequest, "unpriced_option")
		})
	}
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","plugins":[{"id":"file-parser","pdf":{"engine":"pdf-text"}}],"messages":[{"role":"user","content":"hi"}]}`, nil) // a plugin without a fee, spelt plainly
}
