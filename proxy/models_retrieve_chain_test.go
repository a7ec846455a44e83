package proxy_test

import (
	"net/http"
	"net/url"
	"testing"
)

// TestModelRetrieveRefusesAFallbackChainACallRefuses: README, HTTP surface — GET
// /v1/models/{id} answers "any name a call could be billed under", else 404 model_not_found.
// A name holding a comma ("fake-gpt,fake-gpt-mini", Helicone's fallback chain) is priced by
// its prefix, but every call naming it is refused 400 invalid_model: a tool that checks its
// model with models.retrieve before it calls was told the model exists, and then every call
// was refused.
func TestModelRetrieveRefusesAFallbackChainACallRefuses(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	const chain = "fake-gpt,fake-gpt-mini"
	h.postRefused(t, key, "/v1/chat/completions",
		`{"model":"`+chain+`","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, nil,
		http.StatusBadRequest, "invalid_model")
	status, body := h.get(key, "/v1/models/"+url.PathEscape(chain))
	if status != http.StatusNotFound {
		t.Fatalf("GET /v1/models/%s: %d %v; want 404 model_not_found, as a call naming it is refused", chain, status, body)
	}
	if e, _ := body["error"].(map[string]any); e == nil || e["code"] != "model_not_found" {
		t.Fatalf("GET /v1/models/%s: %v; want error code model_not_found", chain, body)
	}
}
