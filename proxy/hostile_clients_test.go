package proxy_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

const plainAnswer = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`

// A caller's body labelled Content-Encoding: gzip (or br, deflate) is read by the gateway as
// it is. The gateway must not forward a body it parsed as plain JSON under a header that tells
// the upstream to decompress it (what the upstream runs is then not what was metered), and a
// body that really is compressed must get a clear refusal, not "not valid JSON".
func TestCompressedRequestBodyIsRefusedNotForwarded(t *testing.T) {
	var mu sync.Mutex
	var seenCE []string
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seenCE = append(seenCE, r.Header.Get("Content-Encoding"))
		mu.Unlock()
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, plainAnswer)
	}, nil)
	_, key := h.user("standard")

	// 1. Plain JSON under Content-Encoding: gzip.
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"Content-Encoding": "gzip"})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	mu.Lock()
	ce := append([]string(nil), seenCE...)
	mu.Unlock()
	t.Logf("plain body + Content-Encoding gzip: status %d %s; upstream saw Content-Encoding %q", resp.StatusCode, bytes.TrimSpace(body), ce)
	for _, v := range ce {
		if v != "" {
			t.Errorf("upstream was sent the plain JSON body the gateway metered, labelled Content-Encoding %q", v)
		}
	}

	// 2. A really gzipped body.
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte(chatBody))
	zw.Close()
	resp = h.post(key, "/v1/chat/completions", zb.String(), map[string]string{"Content-Encoding": "gzip"})
	body = readAll(t, resp.Body)
	resp.Body.Close()
	t.Logf("gzip body: status %d %s", resp.StatusCode, bytes.TrimSpace(body))
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("gzip-compressed body: status %d code %q, want 415 (the encoding is not supported), not a claim that the JSON is invalid",
			resp.StatusCode, errorCode(t, body))
	}
}

// RFC 9110 §11.1: the authentication scheme is case-insensitive. Clients that send
// "bearer <key>" (several hand-rolled ones, some proxies normalising case) are refused.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, plainAnswer)
	}, nil)
	_, key := h.user("standard")
	for _, auth := range []string{"bearer " + key, "BEARER " + key, "Bearer  " + key} {
		resp := h.post("", "/v1/chat/completions", chatBody, map[string]string{"Authorization": auth})
		body := readAll(t, resp.Body)
		resp.Body.Close()
		t.Logf("%q -> %d %s", strings.Replace(auth, key, "<key>", 1), resp.StatusCode, bytes.TrimSpace(body))
		if resp.StatusCode != http.StatusOK {
			t.Errorf("Authorization %q: status %d, want 200", strings.Replace(auth, key, "<key>", 1), resp.StatusCode)
		}
	}
}

// A body of deep nesting (within max_body_bytes) is validated by a recursive descent: one
// request grows its goroutine's stack to hundreds of MiB, and a few at once exhaust memory.
// encoding/json (what Go providers decode with) stops at depth 10000.
func TestDeeplyNestedBodyIsRefusedWithoutDeepRecursion(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, plainAnswer)
	}, nil)
	_, key := h.user("standard")
	prefix := `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"x":`
	n := int(h.cfg.Limits.MaxBodyBytes) - len(prefix) - 1
	body := prefix + strings.Repeat("[", n)

	peak := watchPeakStack()
	start := time.Now()
	resp := h.post(key, "/v1/chat/completions", body, nil)
	rb := readAll(t, resp.Body)
	resp.Body.Close()
	stacks := peak()
	t.Logf("%d-byte body of depth %d: status %d %s in %v; peak stack in use %d MiB", len(body), n, resp.StatusCode,
		bytes.TrimSpace(rb), time.Since(start), stacks>>20)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(rb), "deeper than") {
		t.Errorf("status %d %s, want 400 for nesting too deep", resp.StatusCode, rb)
	}
	if stacks > maxStacksOfOneCall {
		t.Errorf("one request took the process's stacks to %d MiB", stacks>>20)
	}
}
