package proxy

import (
	"bytes"
	"net/http"
	"regexp"
	"strings"
)

// operatorAccountIDs match the ids of the operator's account at the provider that an error
// answer may word (OpenAI's rate-limit refusals name the organisation, "Rate limit reached
// for gpt-4o in organization org-… on tokens per min", and the project): they describe the
// operator's account, not the caller's request, and the gateway keeps them from callers in
// headers (dropResponseHeaders) as in words.
var operatorAccountIDs = regexp.MustCompile(`\b(org-|proj_)[A-Za-z0-9]{8,}`)

// redactAccountID keeps an id's kind and drops the id.
func redactAccountID(id []byte) []byte {
	if bytes.HasPrefix(id, []byte("org-")) {
		return []byte("org-(redacted)")
	}
	return []byte("proj_(redacted)")
}

// anthropicOrganization matches the operator's organisation id, a UUID, where Anthropic's
// rate-limit refusals word it: "the rate limit for your organization (0dccdde6-…) of 20,000
// input tokens per minute", and later "… per minute (org: 8016…, model: …)". Only after those
// words: a UUID elsewhere in an error may be the caller's own (an id it sent, quoted back).
var anthropicOrganization = regexp.MustCompile(`(?i)(organization\s*\(\s*|\borg:\s*)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)

// accountHeaders name the operator's account at the provider in an answer's headers, which
// dropResponseHeaders keeps from callers; their values are kept out of a relayed body too.
var accountHeaders = []string{"Openai-Organization", "Openai-Project", "Anthropic-Organization-Id"}

// minAccountIDLen is the shortest account header value looked for in a body: a shorter one
// (a placeholder, "none") would take words of the message with it.
const minAccountIDLen = 8

// maxAccountIDValues bounds the values of one account header looked for in a body, each a
// pass over it: an account has one id, and thousands of values (what 64 KiB of headers
// holds) cost a pass each, a fifth of a second of CPU per refusal.
const maxAccountIDValues = 4

// redactAccountIDs replaces the ids of the operator's account at the provider that an error
// body words — OpenAI's org- and proj_ ids, Anthropic's organisation UUID, and wherever they
// stand, the values of the answer's own account headers (h) — by "(redacted)", keeping what
// kind of id it was.
func redactAccountIDs(body []byte, h http.Header) []byte {
	body = operatorAccountIDs.ReplaceAllFunc(body, redactAccountID)
	body = anthropicOrganization.ReplaceAll(body, []byte("${1}(redacted)"))
	for _, k := range accountHeaders {
		vals := h.Values(k)
		for _, v := range vals[:min(len(vals), maxAccountIDValues)] {
			if v = strings.TrimSpace(v); len(v) >= minAccountIDLen {
				body = bytes.ReplaceAll(body, []byte(v), []byte("(redacted)"))
			}
		}
	}
	return body
}

// minRedactedKeyLen is the shortest upstream key looked for in what an upstream sends: a
// shorter one (a placeholder a local server takes, "none") would take words of the message
// with it.
const minRedactedKeyLen = 8

// redactKey replaces the upstream's own key (key, the operator's at the provider) wherever
// what the upstream sent quotes it, by "(redacted)". A provider that refuses a key may echo
// it whole ("Incorrect API key provided: sk-…"), and a router or proxy on the way may echo the
// request's Authorization header in any error: relayed, the operator's key reached a caller,
// logged, every reader of the log. Only the call's own upstream was sent this key, so it is the
// only one looked for. A masked echo (OpenAI's "sk-ab***cd") is the provider's own redaction
// and stays.
func redactKey(b []byte, key string) []byte {
	if len(key) < minRedactedKeyLen || !bytes.Contains(b, []byte(key)) {
		return b // read in place: a whole answer of megabytes is not copied to be looked at
	}
	return bytes.ReplaceAll(b, []byte(key), []byte("(redacted)"))
}

// redactKeyString is redactKey for a string (a log field).
func redactKeyString(s, key string) string {
	if len(key) < minRedactedKeyLen || !strings.Contains(s, key) {
		return s
	}
	return strings.ReplaceAll(s, key, "(redacted)")
}

// redactHeaderKey is redactKey for the upstream's answer headers, in place: a router or a
// debugging proxy on the way may quote the request's Authorization in a header of its own,
// and the answer's headers are relayed to the caller (copyResponseHeaders) and kept in an
// Idempotency-Key's record. One look per value, none copied unless it quotes the key.
func redactHeaderKey(h http.Header, key string) {
	if len(key) < minRedactedKeyLen {
		return
	}
	for _, vv := range h {
		for i, v := range vv {
			vv[i] = redactKeyString(v, key)
		}
	}
}
