package proxy

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/tollgate/tollgate/config"
)

// upstreamRequest builds the request to upstream's path: body (rewritten for a call), the
// caller's query and headers less the ones that belong to this hop or to the gateway, and
// the upstream's key.
func (s *Server) upstreamRequest(ctx context.Context, r *http.Request, upstream *config.Upstream, path string, body []byte) (*http.Request, error) {
	u := strings.TrimSuffix(upstream.BaseURL, "/") + path
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	up, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("upstream request %s: %w", u, err)
	}
	hop := connectionListed(r.Header)
	for k, vv := range r.Header {
		if !droppedRequestHeader(k, hop) {
			up.Header[k] = vv
		}
	}
	up.Header.Set("Content-Type", "application/json")
	// Asked here, not by the transport, which would decode by the first Content-Encoding line
	// alone (gunzipping).
	up.Header.Set("Accept-Encoding", "gzip")
	key := upstream.APIKey
	switch upstream.Kind {
	case "anthropic":
		if key != "" {
			up.Header.Set("X-Api-Key", key)
		}
		if up.Header.Get("Anthropic-Version") == "" {
			up.Header.Set("Anthropic-Version", "2023-06-01")
		}
	default:
		if key != "" {
			up.Header.Set("Authorization", "Bearer "+key)
		}
	}
	return up, nil
}

// passPrefix is LiteLLM's: its proxy sends a header named x-pass-<name> on to the provider as
// <name>, whatever its settings (Anthropic's beta header is sent so: asksContext1M reads it).
const passPrefix = "X-Pass-"

// droppedRequestHeader reports whether the caller's header k (canonical) stays behind: it is
// hop-by-hop (one of hop, its Connection header's list), has an underscore in its name (dropped
// as nginx and Apache drop it: CGI-style servers read X_Api_Key as X-Api-Key, which would get
// past the lists below), or is one of dropRequestHeaders or droppedPrefixes, as itself or behind
// passPrefix, any number of times: a LiteLLM proxy in front of the provider would send
// X-Pass-X-Goog-FieldMask on as the field mask, X-Pass-OpenAI-Organization as the account.
func droppedRequestHeader(k string, hop map[string]bool) bool {
	if hop[k] || strings.Contains(k, "_") {
		return true
	}
	for {
		if _, drop := dropRequestHeaders[k]; drop || hasPrefixIn(k, droppedPrefixes) {
			return true
		}
		rest, ok := strings.CutPrefix(k, passPrefix)
		if !ok {
			return false
		}
		k = rest
	}
}

// droppedPrefixes name header families a proxy or router in front of the provider takes claims
// or controls from, dropped by prefix because each family keeps growing and a list would lag
// it. Every X-Forwarded-* is a claim about the client, its URL or its certificate
// (X-Forwarded-Client-Cert, -Scheme, -Ssl). Every X-Envoy-* is obeyed by an Envoy in front of
// the upstream (a mesh sidecar, an egress gateway) from a request it takes as internal, as the
// gateway's is — retries, per-try timeouts — and stripped only at its own edge. The rest are a
// router's per-request settings: LiteLLM's x-litellm-* (timeout, stream-timeout, num-retries,
// tags that route to other deployments, the end user its budgets are kept for) and Portkey's
// x-portkey-* (request-timeout, retry, and a config that may retry, fall back to other models
// or override the model), Cloudflare AI Gateway's cf-aig-* (request-timeout, max-attempts) and
// Helicone's helicone-* (retries, and Helicone-Target-URL: where its gateway sends the request,
// with the operator's provider key). With them a caller set the operator's router to time out
// after the provider had the request (a non-2xx, charged 0, that the provider billed) or to run
// it several times (billed once). Vertex AI's X-Vertex-AI-LLM-* choose how a Gemini call is
// billed: Shared-Request-Type priority at Priority PayGo's dearer rates (service_tier by another
// name), Request-Type shared on pay-as-you-go rather than the operator's provisioned throughput;
// LiteLLM passes either on from behind its x-pass- prefix (droppedRequestHeader). Amazon
// Bedrock's X-Amzn-Bedrock-* choose it alike: Service-Tier priority at a premium over the
// standard rate, PerformanceConfig-Latency optimized at latency-optimized inference's dearer
// rates, and GuardrailIdentifier a guardrail billed per text unit beside the tokens; a router
// that forwards its callers' x- headers (LiteLLM's forward_client_headers_to_llm_api), or x-pass-
// ones, takes them to Bedrock. Azure OpenAI's X-Ms-Spillover-Deployment sends a provisioned deployment's
// overage to the standard deployment it names, billed pay-as-you-go, that would otherwise have
// been refused 429 at no cost.
var droppedPrefixes = []string{"X-Forwarded-", "X-Envoy-", "X-Litellm-", "X-Portkey-", "Cf-Aig-", "Helicone-",
	"X-Vertex-Ai-Llm-", "X-Amzn-Bedrock-", "X-Ms-Spillover-"}

// hasPrefixIn reports whether the canonical header name k starts with one of prefixes.
func hasPrefixIn(k string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// dropRequestHeaders never reach the upstream: hop-by-hop headers, the caller's credentials (in
// any provider's spelling: Azure's api-key, Google's x-goog-api-key too), claims about the
// client's address or the URL or method it used (the upstream or a proxy in front of it may
// trust them: a token count rerouted to a model call would be served free; X-Forwarded-* and
// X-Envoy-* go by their prefix, droppedPrefixes), Google's field mask (X-Goog-FieldMask: a mask
// that leaves `usage` out of the answer has it charged at the estimate alone), the gateway's
// own headers, X-Idempotency-Key (with it Go's transport resends a request whose reused
// connection broke after it was written: the provider may run it twice, charged once), and
// Accept-Encoding (the meter must read plain text: the gateway asks for gzip itself, and
// gunzipping decodes it).
var dropRequestHeaders = setOf("Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Expect", "Content-Encoding", "Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key", "Cookie", "Accept-Encoding",
	"Content-Length", "Host", "X-Run-Id", "Idempotency-Key", "X-Idempotency-Key", "X-Session-Id", "Openai-Organization", "Openai-Project",
	"Forwarded", "X-Real-Ip", "True-Client-Ip", "X-Client-Ip", "Cf-Connecting-Ip", "X-Original-Url", "X-Rewrite-Url",
	"X-Original-Uri", "X-Http-Method-Override", "X-Method-Override", "X-Http-Method", "X-Goog-FieldMask")

// dropResponseHeaders are hop-by-hop, set by the gateway (an upstream that is itself a
// gateway must not rename the caller's run or mark a first answer as a replay), name the
// operator's account at the provider (its organisation and project), which is not the caller's,
// or speak for the provider's host, not the gateway's: HSTS (with includeSubDomains it pins the
// gateway's whole domain to HTTPS in a browser) and Alt-Svc (sends clients to an HTTP/3 port
// the gateway does not serve).
var dropResponseHeaders = setOf("Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Set-Cookie", RunIDHeader, RequestIDHeader, ReplayedHeader, "Openai-Organization", "Openai-Project", "Anthropic-Organization-Id",
	"Strict-Transport-Security", "Alt-Svc")

// droppedResponsePrefixes are the provider's rate-limit headers (OpenAI's x-ratelimit-*,
// Anthropic's anthropic-ratelimit-*): what the operator's account has left, which every
// caller's traffic spends. Relayed, they showed each caller the others' traffic and told it
// limits that are not its own (its own are the gateway's: max_in_flight and its credits).
// An upstream 429's Retry-After is relayed all the same. Dropped too: a LiteLLM proxy's
// x-litellm-* headers about the operator's key there: its total spend (x-litellm-key-spend,
// every caller's traffic again), what the call cost the operator (x-litellm-response-cost,
// not what the caller is charged) and the provider's base URL behind the router
// (x-litellm-model-api-base, an internal deployment's address).
var droppedResponsePrefixes = []string{"X-Ratelimit-", "Anthropic-Ratelimit-", "X-Litellm-"}

func copyResponseHeaders(dst, src http.Header) {
	hop := connectionListed(src)
	for k, vv := range src {
		if _, drop := dropResponseHeaders[k]; !drop && !hop[k] && !hasPrefixIn(k, droppedResponsePrefixes) {
			dst[k] = vv
		}
	}
}

// copyAnswerHeaders copies the headers of an upstream's 2xx answer that go to the caller with
// it (copyResponseHeaders), less the upstream's X-Should-Retry. The OpenAI and Anthropic Go
// SDKs read it on every answer, a 200 too, before its status: "true" has them drop the answer,
// which the gateway has charged, and send the call again (three answers charged for one, by
// default). A provider's advice on retrying goes on with its refusals (relayUpstreamError);
// the gateway sets none on an answer it relays.
func copyAnswerHeaders(dst, src http.Header) {
	copyResponseHeaders(dst, src)
	dst.Del(shouldRetryHeader)
}

// connectionListed returns the (canonical) names h's Connection header lists: hop-by-hop
// for that message alone (RFC 9110 §7.6.1), whatever their name, so never passed on, as
// the fixed lists above are not. nil when it lists none.
func connectionListed(h http.Header) map[string]bool {
	var names map[string]bool
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				if names == nil {
					names = make(map[string]bool)
				}
				names[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	return names
}

func setOf(names ...string) map[string]struct{} {
	m := make(map[string]struct{}, len(names))
	for _, n := range names {
		m[http.CanonicalHeaderKey(n)] = struct{}{}
	}
	return m
}
