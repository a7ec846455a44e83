package proxy_test

import (
	"testing"
)

// TestRouterControlHeadersDoNotReachTheUpstream: a router in front of the provider takes its
// per-request controls from headers — LiteLLM's x-litellm-timeout, -stream-timeout,
// -num-retries and -tags (tag routing, to other deployments), Portkey's
// x-portkey-request-timeout, -retry and -config (an inline config: retries, fallback targets,
// override_params that change the model), Google's X-Goog-FieldMask (which can strip `usage`
// from the answer). Forwarded, a caller set the router to time out after the provider had the
// request (a non-2xx the gateway charges 0, the provider billed), to run it several times
// (billed once), or to hide its usage (charged the estimate alone). They are the operator's
// router's settings, not the caller's: dropped, as Envoy's X-Envoy-* are. README "HTTP surface".
func TestRouterControlHeadersDoNotReachTheUpstream(t *testing.T) {
	up, seen := recordingUpstream(nil)
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	dropped := map[string]string{
		"X-Litellm-Timeout":         "0.01",
		"X-Litellm-Stream-Timeout":  "0.01",
		"X-Litellm-Num-Retries":     "10",
		"X-Litellm-Tags":            "premium",
		"X-Portkey-Request-Timeout": "10",
		"X-Portkey-Retry":           `{"attempts":5,"on_status_codes":[408]}`,
		"X-Portkey-Config":          `{"request_timeout":10,"retry":{"attempts":5},"override_params":{"model":"gpt-dear"}}`,
		"X-Goog-FieldMask":          "choices",
		"X-Goog-Api-Key":            "caller-credential",
	}
	hdr := map[string]string{"X-Caller": "passes"}
	addOtherRouterControls(dropped)
	for k, v := range dropped {
		hdr[k] = v
	}
	got := postedHeaders(h, key, hdr, seen)
	checkNotForwarded(t, got, dropped, "the caller's router control header")
	if got.Get("X-Caller") != "passes" {
		t.Errorf("a caller's end-to-end header was dropped: %q", got.Get("X-Caller"))
	}
}

// addOtherRouterControls adds Cloudflare AI Gateway's and Helicone's per-request controls:
// cf-aig-request-timeout and -max-attempts (a timeout and up to five attempts), Helicone's
// retries, and Helicone-Target-URL, the address Helicone's gateway sends the request on to —
// with the operator's provider key —, and Vertex AI's request types.
func addOtherRouterControls(dropped map[string]string) {
	dropped["Cf-Aig-Request-Timeout"] = "10"
	dropped["Cf-Aig-Max-Attempts"] = "5"
	dropped["Cf-Aig-Authorization"] = "Bearer caller-token"
	dropped["Helicone-Retry-Enabled"] = "true"
	dropped["Helicone-Retry-Num"] = "5"
	dropped["Helicone-Target-Url"] = "https://collector.example"
	// Vertex AI's billing path of a Gemini call: Priority PayGo's dearer rates, or
	// pay-as-you-go instead of the operator's provisioned throughput; LiteLLM passes its x-pass-
	// headers on.
	dropped["X-Vertex-Ai-Llm-Shared-Request-Type"] = "priority"
	dropped["X-Vertex-Ai-Llm-Request-Type"] = "shared"
	dropped["X-Pass-X-Vertex-Ai-Llm-Shared-Request-Type"] = "priority"
}
