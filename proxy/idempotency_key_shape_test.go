package proxy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestIdemKeyOfAnyPrintableCharacterUpToItsBound: a key is 1-255 printable ASCII characters
// (README), its bounds included: a key of 255 characters, holding the first and last printable
// ones (a space, inside, and '~'), makes its request safe to retry like any other — run once, its retry
// replayed. Refused 400 at a bound, a client's valid key (a UUID with a prefix, a base64 hash
// ending in '~' in some alphabets) could not be used at all.
func TestIdemKeyOfAnyPrintableCharacterUpToItsBound(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	idemKey := "~ " + strings.Repeat("k", 251) + " ~" // HTTP trims a value's outer spaces
	if len(idemKey) != 255 {
		t.Fatalf("key of %d characters, want 255", len(idemKey))
	}
	hdr := map[string]string{proxy.IdempotencyKeyHeader: idemKey}
	calls := h.fake.Calls()
	resp, first := h.postOK(t, key, "/v1/chat/completions", chatBody, hdr) // a key at its bounds
	runID := resp.Header.Get(proxy.RunIDHeader)

	resp = h.post(key, "/v1/chat/completions", chatBody, hdr)
	again := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(proxy.ReplayedHeader) != "true" || string(again) != string(first) {
		t.Fatalf("retry under a key at its bounds: %d replayed=%q %s; want the first answer replayed", resp.StatusCode,
			resp.Header.Get(proxy.ReplayedHeader), again)
	}
	if n := h.fake.Calls() - calls; n != 1 {
		t.Fatalf("upstream called %d times for one key, want 1", n)
	}
	h.expectCharges(u.ID, []string{runID})
}

// TestIdemRunIDIsTheKeysHash: an Idempotency-Key's first attempt runs under
// "r_" + hex(sha256(user \0 key))[:32], and its record lives under that id (DESIGN §6). Every
// gateway of a fleet must derive the same id, whatever its version: during a rolling upgrade a
// retry that reached a gateway deriving another id found neither the first attempt's hold
// (its in-flight guard) nor its record, and ran, and was charged, a second time.
func TestIdemRunIDIsTheKeysHash(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const idemKey = "run-id-shape"
	sum := sha256.Sum256([]byte(strconv.FormatUint(u.ID, 10) + "\x00" + idemKey))
	want := "r_" + hex.EncodeToString(sum[:16])
	if got := proxy.IdempotentRunID(u.ID, idemKey, 0); got != want {
		t.Fatalf("attempt 0 of key %q runs as %s, want %s", idemKey, got, want)
	}
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{proxy.IdempotencyKeyHeader: idemKey})
	readAll(t, resp.Body)
	resp.Body.Close()
	if got := resp.Header.Get(proxy.RunIDHeader); resp.StatusCode != http.StatusOK || got != want {
		t.Fatalf("answered %d as run %q, want 200 as %s", resp.StatusCode, got, want)
	}
	h.settled()
	if n, err := h.rdb.Exists(context.Background(), h.keys.Replay(want)).Result(); err != nil || n != 1 {
		t.Fatalf("record under %s: %d %v, want it there", h.keys.Replay(want), n, err)
	}
}

// TestIdemKeyOutsidePrintableASCIIIsRefused: a key holding a byte HTTP lets through in a header
// value but that is not printable ASCII — a tab inside it, a UTF-8 letter (bytes 0x80-0xff) —
// is refused 400 invalid_idempotency_key, before any hold (README: 1-255 printable ASCII
// characters). Accepted, one key was two to a fleet whose proxies normalise or re-encode such
// bytes: a retry that reached the gateway altered ran, and was charged, a second time.
func TestIdemKeyOutsidePrintableASCIIIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, k := range []string{"with\ttab", "cl\xc3\xa9", "high\xff"} {
		t.Run(strconv.Quote(k), func(t *testing.T) {
			// want 400 invalid_idempotency_key, no hold, no upstream call
			h.postRefused(t, key, "/v1/chat/completions", chatBody, map[string]string{proxy.IdempotencyKeyHeader: k},
				http.StatusBadRequest, "invalid_idempotency_key")
		})
	}
}
