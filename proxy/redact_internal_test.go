package proxy

import (
	"errors"
	"net/url"
	"strings"
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
