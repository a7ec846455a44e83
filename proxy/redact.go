package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/tollgate/tollgate/config"
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
//
// A key of letters, digits and -._~ (every provider's so far) is looked for as sent; one with
// other characters in each spelling keyForms knows too: a JSON body quotes "sk/a+b" as
// "sk\/a+b", and a key echoed so reached the caller whole.
func redactKey(b []byte, key string) []byte {
	for _, f := range spellingsOf(key).asBytes {
		b = redactSpelling(b, f)
	}
	return b
}

// redactSpelling is b with every occurrence of spelling replaced by "(redacted)": b itself when
// there is none, read in place (a whole answer of megabytes is not copied to be looked at).
func redactSpelling(b, spelling []byte) []byte {
	if !bytes.Contains(b, spelling) {
		return b
	}
	return bytes.ReplaceAll(b, spelling, []byte("(redacted)"))
}

// redactKeyString is redactKey for a string (a header value). A log field quoting an upstream
// goes through loggedUpstream, which also bounds the quote.
func redactKeyString(s, key string) string {
	for _, f := range keyForms(key) {
		s = strings.ReplaceAll(s, f, "(redacted)")
	}
	return s
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

// loggedCut ends a quote of an upstream that loggedUpstream cut at maxLoggedBytes, so that a
// reader knows there was more.
const loggedCut = "…(cut)"

// loggedUpstream is what a log line quotes of what upstream up sent (an error answer's body, the
// head of an answer that was none, an error's words, a header value), or of an error of a call
// to it (the transport's words name the upstream's URL, and quote what it sent: a malformed
// status line, an HTTP/2 GOAWAY's debug data): up's key in every spelling keyForms knows
// replaced by "(redacted)", then cut to maxLoggedBytes, loggedCut included. It is the one rule
// for such a field: the key is never in the log, and a peer cannot fill the log.
//
// Only what the quote can show is looked at: its first maxLoggedBytes, and past them the
// longest spelling of the key, so that a key which straddles the cut is replaced whole before
// the cut is made, never left half-quoted; a 64 KiB error body costs what a short one does.
func loggedUpstream[T ~string | ~[]byte](up *config.Upstream, b T) string {
	forms := keyForms(up.APIKey)
	window := maxLoggedBytes
	if len(forms) > 0 {
		window += len(forms[0])
	}
	s := string(b[:min(len(b), window)])
	for _, f := range forms {
		s = strings.ReplaceAll(s, f, "(redacted)")
	}
	whole := len(b) <= window
	if whole && len(s) <= maxLoggedBytes {
		return s
	}
	if !whole && len(forms) > 0 {
		// The window's last bytes may be the start of a spelling it cut (shown when the
		// replacements before it left the quote short): dropped.
		s = s[:max(0, len(s)-(len(forms[0])-1))]
	}
	cut := min(len(s), maxLoggedBytes-len(loggedCut))
	for i := 0; i < utf8.UTFMax && cut > 0 && cut < len(s) && !utf8.RuneStart(s[cut]); i++ {
		cut-- // not inside a character: the line's JSON would show it as U+FFFD
	}
	return s[:cut] + loggedCut
}

// keyForms are the spellings of key that what an upstream sends may quote it in (spellKey),
// worked out once per key: looked for in every event relayed and every log line quoting an
// upstream, they are read there, not made again (a key with characters JSON or a URL escapes
// costs a dozen JSON encodes).
func keyForms(key string) []string {
	return spellingsOf(key).asStrings
}

// keySpellings are a key's spellings (spellKey), as strings (a quote in a log line, a header
// value) and as bytes (a relayed body or event, looked at in place). Shared by every call:
// read, never changed.
type keySpellings struct {
	asStrings []string
	asBytes   [][]byte
}

// maxSpelledKeys bounds the keys spelled keeps: the configured upstreams' keys, a few. A
// process that has looked for more (a test's many gateways) starts again from the one it is
// looking for.
const maxSpelledKeys = 64

// spelled maps each key looked for so far to its spellings. It is read without a lock on the
// hot path; a key not in it is added, under spelledMu, to a copy that replaces it.
var (
	spelled   atomic.Pointer[map[string]keySpellings]
	spelledMu sync.Mutex
)

// spellingsOf is key's spellings, worked out the first time it is looked for; none when key is
// shorter than minRedactedKeyLen (see redactKey).
func spellingsOf(key string) keySpellings {
	if len(key) < minRedactedKeyLen {
		return keySpellings{}
	}
	if m := spelled.Load(); m != nil {
		if sp, ok := (*m)[key]; ok {
			return sp
		}
	}
	spelledMu.Lock()
	defer spelledMu.Unlock()
	m := map[string]keySpellings{}
	if old := spelled.Load(); old != nil {
		if sp, ok := (*old)[key]; ok {
			return sp // added while this one waited for the lock
		}
		if len(*old) < maxSpelledKeys {
			m = maps.Clone(*old)
		}
	}
	sp := keySpellings{asStrings: spellKey(key)}
	for _, f := range sp.asStrings {
		sp.asBytes = append(sp.asBytes, []byte(f))
	}
	m[key] = sp
	spelled.Store(&m)
	return sp
}

// spellKey is the spellings of key that what an upstream sends may quote it in, longest first:
// as sent or as a URL quotes it (a transport error names the URL), each as a JSON encoder
// escapes it in a string (Go's escapes <, >, & as \u003c…; others escape / as \/), and that
// escaped again (a transport error quotes with %q the line it could not read, which may be
// JSON). None when key is shorter than minRedactedKeyLen (see redactKey). A key of the usual
// letters, digits, - and _ has one spelling.
func spellKey(key string) []string {
	if len(key) < minRedactedKeyLen {
		return nil
	}
	if !strings.ContainsFunc(key, escaped) {
		return []string{key}
	}
	forms := []string{}
	add := func(f string) {
		if !slices.Contains(forms, f) {
			forms = append(forms, f)
		}
	}
	for _, f := range []string{key, url.QueryEscape(key), url.PathEscape(key)} {
		add(f)
		for _, once := range jsonEscapes(f) {
			add(once)
			for _, twice := range jsonEscapes(once) {
				add(twice)
			}
		}
	}
	// Longest first: a spelling inside a longer one is not replaced out of it first.
	slices.SortStableFunc(forms, func(a, b string) int { return len(b) - len(a) })
	return forms
}

// escaped reports whether a JSON encoder or a URL may spell r otherwise than as itself: all but
// ASCII letters, digits and -._~.
func escaped(r rune) bool {
	return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("-._~", r))
}

// jsonEscapes are the ways a JSON encoder spells s inside a string: Go's (<, >, & as \u003c…),
// without those, and either with / as \/.
func jsonEscapes(s string) []string {
	var plain bytes.Buffer
	enc := json.NewEncoder(&plain)
	enc.SetEscapeHTML(false)
	if enc.Encode(s) != nil {
		return nil
	}
	html, _ := json.Marshal(s)
	p := bytes.TrimSuffix(plain.Bytes(), []byte("\n"))
	out := []string{string(p[1 : len(p)-1]), string(html[1 : len(html)-1])}
	return append(out, strings.ReplaceAll(out[0], "/", `\/`), strings.ReplaceAll(out[1], "/", `\/`))
}

// loggedUpstreamErr is err, of a call to up, as a log line quotes it (loggedUpstream); nil when
// err is. It unwraps to err, but is meant for a log field (zap.Error, logRefusal) only.
func loggedUpstreamErr(up *config.Upstream, err error) error {
	if err == nil {
		return nil
	}
	return loggedError{msg: loggedUpstream(up, err.Error()), err: err}
}

// loggedPanic is a recovered panic's value v, in a call to up, as a log line quotes it
// (loggedUpstream): an error can wrap what the upstream answered, its key quoted and of any
// length. With no upstream (nil) the value is only bounded.
func loggedPanic(up *config.Upstream, v any) string {
	if up == nil {
		up = &config.Upstream{}
	}
	return loggedUpstream(up, fmt.Sprint(v))
}

// loggedPanicOf is loggedPanic for a panic outside any one call's upstream: every configured
// upstream's key replaced in the value's words, then bounded. The words are read whole, as
// loggedUpstream's window would not be: a panic is rare, and the keys are several.
func loggedPanicOf(ups []config.Upstream, v any) string {
	words := fmt.Sprint(v)
	for i := range ups {
		words = redactKeyString(words, ups[i].APIKey)
	}
	return loggedPanic(nil, words)
}

// loggedError is an error's words as a log line may quote them (loggedUpstreamErr).
type loggedError struct {
	msg string
	err error
}

func (e loggedError) Error() string { return e.msg }
func (e loggedError) Unwrap() error { return e.err }
