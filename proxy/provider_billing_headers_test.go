package proxy_test

import (
	"testing"
)

// TestProviderBillingHeadersDoNotReachTheUpstream: as Vertex AI's X-Vertex-AI-LLM-* request
// types are dropped (TestRouterControlHeadersDoNotReachTheUpstream), so must be the headers by
// which Azure OpenAI and Amazon Bedrock let one request choose how it is billed. Azure OpenAI's
// x-ms-spillover-deployment sends a provisioned (PTU) deployment's overage to the standard
// deployment it names, billed pay-as-you-go per token, where without it the call is refused 429
// and costs nothing; Bedrock's X-Amzn-Bedrock-Service-Tier (priority: a premium over the
// standard rate), X-Amzn-Bedrock-PerformanceConfig-Latency (optimized: latency-optimized
// inference at its own, dearer, rates) and X-Amzn-Bedrock-GuardrailIdentifier (a guardrail
// billed per text unit beside the tokens) reach Bedrock through a router that forwards its
// callers' x- headers (LiteLLM's forward_client_headers_to_llm_api) or its x-pass- ones. The
// gateway bills each call at the model's configured price: the caller chose, and the operator
// paid, another one.
func TestProviderBillingHeadersDoNotReachTheUpstream(t *testing.T) {
	up, seen := recordingUpstream(nil)
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	dropped := map[string]string{
		"X-Ms-Spillover-Deployment":                       "gpt-4o-standard",
		"X-Pass-X-Ms-Spillover-Deployment":                "gpt-4o-standard",
		"X-Amzn-Bedrock-Service-Tier":                     "priority",
		"X-Amzn-Bedrock-Performanceconfig-Latency":        "optimized",
		"X-Amzn-Bedrock-Guardrailidentifier":              "gr-abc123",
		"X-Pass-X-Amzn-Bedrock-Service-Tier":              "priority",
		"X-Pass-X-Amzn-Bedrock-Performanceconfig-Latency": "optimized",
	}
	hdr := map[string]string{"X-Caller": "passes"}
	for k, v := range dropped {
		hdr[k] = v
	}
	got := postedHeaders(h, key, hdr, seen)
	checkNotForwarded(t, got, dropped, "the caller's choice of the provider's billing")
	if got.Get("X-Caller") != "passes" {
		t.Errorf("a caller's end-to-end header was dropped: %q", got.Get("X-Caller"))
	}
}

// TestPassPrefixCarriesNoDroppedHeader: LiteLLM's proxy forwards any header named x-pass-<name>
// to the provider as <name>, whatever its settings. Each header the gateway drops must be
// dropped behind that prefix too, else a caller has LiteLLM send it on: X-Goog-FieldMask (a
// mask that leaves usage out of the answer, charged then at the prompt's estimate alone),
// OpenAI-Organization and -Project (the operator's other account at the provider), credentials
// in a provider's spelling, X-Idempotency-Key, Accept-Encoding. A header of the caller's own
// (x-pass-anthropic-beta, which asksContext1M reads) still goes on.
func TestPassPrefixCarriesNoDroppedHeader(t *testing.T) {
	up, seen := recordingUpstream(nil)
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	dropped := map[string]string{
		"X-Pass-X-Goog-Fieldmask":        "id,choices",
		"X-Pass-Openai-Organization":     "org-other",
		"X-Pass-Openai-Project":          "proj_other",
		"X-Pass-Authorization":           "Bearer caller-credential",
		"X-Pass-X-Goog-Api-Key":          "caller-credential",
		"X-Pass-X-Idempotency-Key":       "k1",
		"X-Pass-Accept-Encoding":         "br",
		"X-Pass-X-Http-Method-Override":  "GET",
		"X-Pass-Helicone-Target-Url":     "https://collector.example",
		"X-Pass-X-Pass-X-Goog-Fieldmask": "id",
	}
	hdr := map[string]string{"X-Pass-Anthropic-Beta": "token-efficient-tools-2025-02-19"}
	for k, v := range dropped {
		hdr[k] = v
	}
	got := postedHeaders(h, key, hdr, seen)
	checkNotForwarded(t, got, dropped, "a dropped header behind LiteLLM's x-pass- prefix")
	if got.Get("X-Pass-Anthropic-Beta") == "" {
		t.Errorf("the caller's own x-pass- header was dropped")
	}
}
