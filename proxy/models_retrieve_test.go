package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate/config"
)

// TestModelRetrieveAnswersWhatCanBeCalled: the SDKs' models.retrieve (GET /v1/models/{id}),
// which tools call to check a model before using it, answers a model the gateway prices —
// by its exact name, a dated name priced by its prefix, a name with a slash as open-weight
// models have — and 404 model_not_found for one it would refuse to bill.
func TestModelRetrieveAnswersWhatCanBeCalled(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Models["org/open-7b"] = c.Models["fake-gpt"] })
	_, key := h.user("standard")
	client := openai.NewClient(option.WithBaseURL(h.gw.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	ctx := context.Background()
	for _, id := range []string{"fake-gpt", "fake-gpt-2026-01-01", "org/open-7b"} {
		m, err := client.Models.Get(ctx, id)
		if err != nil {
			t.Fatalf("retrieve %q through the SDK: %v", id, err)
		}
		if m.ID != id || m.Object != "model" || m.OwnedBy != "fake-openai" {
			t.Fatalf("retrieve %q: %+v, want the model owned by its upstream", id, m)
		}
	}
	// Python's SDK puts the id in the path unescaped.
	if status, body := h.get(key, "/v1/models/org/open-7b"); status != http.StatusOK || body["id"] != "org/open-7b" {
		t.Fatalf("GET /v1/models/org/open-7b: %d %v", status, body)
	}

	_, err := client.Models.Get(ctx, "not-priced")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Fatalf("retrieve of an unpriced model: %v, want 404 model_not_found", err)
	}
	if status, _ := h.get("tg_wrong", "/v1/models/fake-gpt"); status != http.StatusUnauthorized {
		t.Fatalf("retrieve with a wrong key: %d, want 401", status)
	}
}
