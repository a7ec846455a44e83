package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/tollgate/tollgate/config"
)

// TestLoggedUpstreamLeavesNoPartOfTheKey: wherever the upstream's key stands in what is quoted
// — before the cut, across it, just past it, after replacements that shortened the quote — no
// part of it is logged, and the quote is at most maxLoggedBytes, its cut marked. Cutting first
// and redacting after left the start of a key that straddled the cut.
func TestLoggedUpstreamLeavesNoPartOfTheKey(t *testing.T) {
	const key = "opkey/0123456789+abcdefXYZ"
	up := &config.Upstream{Name: "u", APIKey: key}
	for _, spelling := range []string{key, `opkey\/0123456789+abcdefXYZ`, url.QueryEscape(key), url.PathEscape(key)} {
		for off := 0; off <= maxLoggedBytes+len(spelling)+2; off++ {
			for _, in := range []string{
				strings.Repeat("a", off) + spelling + strings.Repeat("b", 2000),
				strings.Repeat("a", off) + spelling,
				strings.Repeat(spelling, 60) + strings.Repeat("a", off) + spelling + strings.Repeat("b", 600),
			} {
				out := loggedUpstream(up, in)
				if strings.Contains(out, key[:3]) {
					t.Fatalf("spelling %q at %d of %d bytes: the quote holds part of the key: %q", spelling, off, len(in), out)
				}
				if len(out) > maxLoggedBytes {
					t.Fatalf("spelling %q at %d: %d bytes quoted, want at most %d", spelling, off, len(out), maxLoggedBytes)
				}
				if cut := len(in) > maxLoggedBytes+len(spelling); cut && !strings.HasSuffix(out, loggedCut) {
					t.Fatalf("spelling %q at %d of %d bytes: the cut is not marked: %q", spelling, off, len(in), out)
				}
			}
		}
	}
	// The same for bytes.
	if out := loggedUpstream(up, []byte(strings.Repeat("a", 500)+key+strings.Repeat("b", 100))); strings.Contains(out, key[:3]) || len(out) > maxLoggedBytes {
		t.Errorf("bytes: %q", out)
	}
}

// TestLoggedUpstreamKeepsWhatHoldsNoKey: a quote within the bound is kept as sent, a longer one
// is its start, marked and cut between characters; a key shorter than minRedactedKeyLen is not
// looked for (it would take words of the message with it), and a Go JSON encoder's spelling of
// a key (its <, >, & as \u003c…) is.
func TestLoggedUpstreamKeepsWhatHoldsNoKey(t *testing.T) {
	up := &config.Upstream{APIKey: "none"}
	if out := loggedUpstream(up, "none of this is a key"); out != "none of this is a key" {
		t.Errorf("short key: %q, want the words as sent", out)
	}
	long := strings.Repeat("é", maxLoggedBytes) // two bytes each
	out := loggedUpstream(up, long)
	if !strings.HasSuffix(out, loggedCut) || len(out) > maxLoggedBytes || !utf8.ValidString(out) ||
		!strings.HasPrefix(long, strings.TrimSuffix(out, loggedCut)) {
		t.Errorf("long quote: %d bytes %q, want its start, whole characters, marked", len(out), out)
	}
	html := &config.Upstream{APIKey: "op<key>&0123456789"}
	if out := loggedUpstream(html, `{"message":"bad key op\u003ckey\u003e\u00260123456789"}`); strings.Contains(out, "0123456789") {
		t.Errorf("JSON-escaped key: %q", out)
	}
	if loggedUpstreamErr(html, nil) != nil {
		t.Error("no error logged as an error")
	}
	base := errors.New("dial op<key>&0123456789")
	if err := loggedUpstreamErr(html, base); !errors.Is(err, base) || strings.Contains(err.Error(), "0123456789") {
		t.Errorf("error %q: want the key left out, unwrapping to its cause", err)
	}
}

// TestRedactKeyTakesEverySpellingFromAnswers: what is relayed to the caller (an error body, a
// stream's event, a header) has the upstream's key left out in each spelling keyForms knows,
// not only as sent: a JSON error body quoting a key with / + < & > escapes them, and that
// spelling reached the caller whole. A key of plain characters is looked for as sent, and an
// answer that holds none is returned as it came, not copied.
func TestRedactKeyTakesEverySpellingFromAnswers(t *testing.T) {
	const key = "sk-op/0123456789+<&>"
	for _, f := range keyForms(key) {
		in := `{"error":{"message":"bad key ` + f + `, again: ` + f + `"}}`
		if out := redactKey([]byte(in), key); strings.Contains(string(out), "0123456789") {
			t.Errorf("spelling %q: relayed %s", f, out)
		}
		if out := redactKeyString(in, key); strings.Contains(out, "0123456789") {
			t.Errorf("spelling %q in a header: relayed %s", f, out)
		}
	}
	if len(keyForms(key)) < 4 {
		t.Fatalf("keyForms(%q) = %q: want the JSON- and URL-escaped spellings too", key, keyForms(key))
	}
	plain := []byte(`{"error":{"message":"no key here"}}`)
	if out := redactKey(plain, "sk-plain0123456789"); &out[0] != &plain[0] {
		t.Error("an answer quoting no key was copied")
	}
	if out := redactKey([]byte("key sk-plain0123456789."), "sk-plain0123456789"); string(out) != "key (redacted)." {
		t.Errorf("plain key: %q", out)
	}
}

// BenchmarkRedactKey is what looking for the upstream's key costs each event relayed, each log
// line quoting an upstream and each answer's request id, for a key of plain characters and for
// one with characters that have other spellings (keyForms): an event that quotes no key.
func BenchmarkRedactKey(b *testing.B) {
	event := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" the"}}]}`)
	for _, key := range []string{"sk-proj-" + strings.Repeat("a1B2", 40), "sk-op/" + strings.Repeat("a1B2", 40) + "+<&>"} {
		up := &config.Upstream{Name: "u", APIKey: key}
		name := "plain"
		if strings.ContainsFunc(key, escaped) {
			name = "escaped"
		}
		b.Run(name+"/event", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				redactKey(event, key)
			}
		})
		b.Run(name+"/logged", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				loggedUpstream(up, "invalid_request_error")
			}
		})
		resp := &http.Response{Header: http.Header{"X-Request-Id": {"req_0123456789abcdef"}}}
		b.Run(name+"/request_id", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				upstreamRequestID(resp, up)
			}
		})
	}
}

// TestKeyFormsAreTheKeysSpellingsWhateverWasLookedForBefore: the spellings kept per key are
// those spellKey works out, for a key looked for again, after maxSpelledKeys others made the
// keeper start again, and for keys looked for at once from many goroutines.
func TestKeyFormsAreTheKeysSpellingsWhateverWasLookedForBefore(t *testing.T) {
	const key = "sk-op/0123456789+<&>"
	check := func(k string) error {
		want := spellKey(k)
		if got := keyForms(k); !slices.Equal(got, want) {
			return fmt.Errorf("keyForms(%q) = %q, want %q", k, got, want)
		}
		sp := spellingsOf(k)
		if len(sp.asBytes) != len(want) {
			return fmt.Errorf("%q: %d spellings as bytes, want %d", k, len(sp.asBytes), len(want))
		}
		for i, f := range want {
			if string(sp.asBytes[i]) != f {
				return fmt.Errorf("%q: spelling %d as bytes %q, want %q", k, i, sp.asBytes[i], f)
			}
		}
		return nil
	}
	for _, k := range []string{key, key} {
		if err := check(k); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range 2*maxSpelledKeys + 1 {
		wg.Go(func() {
			if err := check(fmt.Sprintf("sk-%d/0123456789+abc", i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, k := range []string{key, "sk-plain0123456789"} {
		if err := check(k); err != nil {
			t.Error(err)
		}
	}
	if got := keyForms("short"); got != nil {
		t.Errorf("keyForms of a key shorter than minRedactedKeyLen = %q, want none", got)
	}
}

// TestAccountIDRedactionKeepsTheRestOfTheWords: an error body's operator account ids go — an
// OpenAI org- or proj_ id keeping its kind, Anthropic's organisation UUID keeping the words
// that name it, each of an account header's values wherever it stands — and every other word
// stays as the provider sent it: an org- that is part of a longer word or too short to be an
// id, a UUID of the caller's that no organisation words precede, a header value too short to
// be an id.
func TestAccountIDRedactionKeepsTheRestOfTheWords(t *testing.T) {
	h := http.Header{
		"Openai-Organization": {"org-AbCdEf0123456789ghIJklMN", "73418265"},
		"Openai-Project":      {"none"},
	}
	in := `{"error":{"message":"Rate limit reached for cyborg-assistant01 in organization org-AbCdEf0123456789ghIJklMN ` +
		`(project proj_Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2) on tokens per min, over your org-level limit; none of request ` +
		`3f2a9c1e-0b4d-4c6e-8f70-1a2b3c4d5e6f is served; the rate limit for your organization (0dccdde6-f924-4f1b-bb3b-92ef846e0a5b), ` +
		`org: 80162711-722B-4454-ae75-c6334e6796f2, account 73418265.","type":"tokens"}}`
	want := `{"error":{"message":"Rate limit reached for cyborg-assistant01 in organization org-(redacted) ` +
		`(project proj_(redacted)) on tokens per min, over your org-level limit; none of request ` +
		`3f2a9c1e-0b4d-4c6e-8f70-1a2b3c4d5e6f is served; the rate limit for your organization ((redacted)), ` +
		`org: (redacted), account (redacted).","type":"tokens"}}`
	if got := string(redactAccountIDs([]byte(in), h)); got != want {
		t.Errorf("redacted\n%s\nwant\n%s", got, want)
	}
}

// TestKeyOfTheShortestLookedForLengthIsRedacted: a key of minRedactedKeyLen characters is
// looked for in a relayed body, a log line's quote and the answer's headers alike; one
// character shorter it is not (it would take words of the message with it).
func TestKeyOfTheShortestLookedForLengthIsRedacted(t *testing.T) {
	const key = "sk-8char"
	if len(key) != minRedactedKeyLen {
		t.Fatalf("the test's key has %d characters, want minRedactedKeyLen (%d)", len(key), minRedactedKeyLen)
	}
	if got := string(redactKey([]byte("bad key sk-8char."), key)); got != "bad key (redacted)." {
		t.Errorf("relayed body: %q", got)
	}
	if got := loggedUpstream(&config.Upstream{APIKey: key}, "bad key sk-8char."); got != "bad key (redacted)." {
		t.Errorf("log quote: %q", got)
	}
	h := http.Header{"X-Echo-Authorization": {"Bearer sk-8char"}}
	if redactHeaderKey(h, key); h.Get("X-Echo-Authorization") != "Bearer (redacted)" {
		t.Errorf("header: %q", h.Get("X-Echo-Authorization"))
	}
	short := key[:minRedactedKeyLen-1]
	if got := string(redactKey([]byte("bad key "+short), short)); got != "bad key "+short {
		t.Errorf("a key shorter than minRedactedKeyLen was looked for: %q", got)
	}
	h = http.Header{"X-Echo-Authorization": {"Bearer " + short}}
	if redactHeaderKey(h, short); h.Get("X-Echo-Authorization") != "Bearer "+short {
		t.Errorf("a key shorter than minRedactedKeyLen was looked for in a header: %q", h.Get("X-Echo-Authorization"))
	}
}

// TestSpelledKeysAreBounded: the keys whose spellings are kept are at most maxSpelledKeys,
// however many were looked for (a test's many gateways, each with a key of its own).
func TestSpelledKeysAreBounded(t *testing.T) {
	for i := range 3 * maxSpelledKeys {
		keyForms(fmt.Sprintf("sk-bound-%d/0123456789", i))
	}
	if m := spelled.Load(); m == nil || len(*m) > maxSpelledKeys {
		n := -1
		if m != nil {
			n = len(*m)
		}
		t.Errorf("%d keys' spellings kept, want at most %d", n, maxSpelledKeys)
	}
}

// TestLoggedUpstreamQuotesWholeWhatFitsOnceTheKeyIsOut: a quote that fits in maxLoggedBytes
// once its key is replaced is logged whole, unmarked — one longer than the bound by less than
// the key, one of exactly the window looked at, one of exactly maxLoggedBytes — and a longer
// one cut inside a character is cut before it, its line valid UTF-8.
func TestLoggedUpstreamQuotesWholeWhatFitsOnceTheKeyIsOut(t *testing.T) {
	const key = "opkey/0123456789+abcdefXYZ"
	up := &config.Upstream{APIKey: key}
	window := maxLoggedBytes + len(keyForms(key)[0])
	for _, in := range []string{
		strings.Repeat("a", maxLoggedBytes-len("(redacted)")-16) + key + strings.Repeat("b", 16),
		key + key + strings.Repeat("a", window-2*len(key)),
		strings.Repeat("a", maxLoggedBytes),
	} {
		if out, want := loggedUpstream(up, in), strings.ReplaceAll(in, key, "(redacted)"); out != want {
			t.Errorf("%d bytes quoted as %d bytes %q, want %d bytes, whole", len(in), len(out), out, len(want))
		}
	}
	for _, k := range []string{"none", key} {
		in := "x" + strings.Repeat("é", maxLoggedBytes)
		out := loggedUpstream(&config.Upstream{APIKey: k}, in)
		if !utf8.ValidString(out) || !strings.HasSuffix(out, loggedCut) || len(out) > maxLoggedBytes ||
			!strings.HasPrefix(in, strings.TrimSuffix(out, loggedCut)) {
			t.Errorf("key %q: long quote of two-byte characters after one byte: %d bytes %q, want its start, whole characters, marked", k, len(out), out)
		}
	}
}
