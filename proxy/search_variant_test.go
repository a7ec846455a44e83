package proxy_test

import (
	"net/http"
	"testing"
)

// TestSearchVariantPricedByItsPrefixIsRefused: a search model (gpt-4o-search-preview,
// gpt-5-search-api) searches the web on every call, billed per search beside its tokens.
// Named under a configured prefix (gpt-4o), it was served at that model's token prices, the
// searches paid by the operator. It is refused 400 unpriced_option before anything is held,
// asked for or as a router's fallback, and GET /v1/models/{id} does not list it; priced by
// its own name, the operator's choice, it is served.
func TestSearchVariantPricedByItsPrefixIsRefused(t *testing.T) {
	h := newHarness(t, func(c *configT) {
		c.Models["fake-gpt-search-api"] = c.Models["fake-gpt"]
	})
	u, key := h.user("standard")
	for _, body := range []string{
		`{"model":"fake-gpt-search-preview","messages":[{"role":"user","content":"news?"}]}`,
		`{"model":"fake-gpt-mini-Search-Preview","messages":[{"role":"user","content":"news?"}]}`,
		`{"model":"fake-gpt","models":["fake-gpt","fake-gpt-search-preview"],"messages":[{"role":"user","content":"news?"}]}`,
	} {
		calls := h.fake.Calls()
		h.postRefused(t, key, "/v1/chat/completions", body, nil, http.StatusBadRequest, "unpriced_option")
		if h.fake.Calls() != calls {
			t.Fatalf("%s: refused, yet the upstream was called", body)
		}
	}
	if status, body := h.get(key, "/v1/models/fake-gpt-search-preview"); status != http.StatusNotFound {
		t.Errorf("GET /v1/models/fake-gpt-search-preview: %d %v; want 404, as every call naming it is refused", status, body)
	}
	if status, body := h.get(key, "/v1/models/fake-gpt-2024-08-06"); status != http.StatusOK {
		t.Errorf("GET /v1/models/fake-gpt-2024-08-06: %d %v; want 200, a dated name priced by its prefix", status, body)
	}
	run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", `{"model":"fake-gpt-search-api","messages":[{"role":"user","content":"news?"}]}`, nil)
	if run.CostMicro == 0 {
		t.Errorf("a search model priced by its own name: settled %+v, want it served and charged", run)
	}
}
