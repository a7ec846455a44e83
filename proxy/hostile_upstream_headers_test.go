package proxy_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestUpstreamHeadersAreBounded: an upstream whose answer carries a megabyte of headers (a
// broken proxy, a runaway Set-Cookie) is refused once its headers pass the bound, as an answer
// that cannot be relayed: without a bound of its own the transport read up to 10 MB of headers
// per call, kept them for the call's life and copied them to the caller.
func TestUpstreamHeadersAreBounded(t *testing.T) {
	junk := strings.Repeat("j", 16<<10)
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		for i := range 64 { // 1 MiB of headers
			w.Header().Set("X-Junk-"+strconv.Itoa(i), junk)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`))
	}, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	answer := readAll(t, resp.Body)
	resp.Body.Close()
	size := 0
	for k, vv := range resp.Header {
		for _, v := range vv {
			size += len(k) + len(v)
		}
	}
	run := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
	t.Logf("status %d, %d bytes of headers: %.200s; run src=%s in=%d out=%d charged=%d", resp.StatusCode, size, answer,
		run.SettleSource.String, run.InTok, run.OutTok, run.ChargedMicro)
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, answer) != "upstream_broken" {
		t.Fatalf("status %d %s, want 502 upstream_broken", resp.StatusCode, answer)
	}
	if size > 64<<10 {
		t.Fatalf("%d bytes of the upstream's headers reached the caller", size)
	}
	if resp.Header.Get("X-Should-Retry") != "false" {
		t.Errorf("X-Should-Retry %q, want false: the provider answers a retry the same way", resp.Header.Get("X-Should-Retry"))
	}
	// The provider had the prompt and answered: charged its estimate, as an answer in an
	// encoding the gateway did not ask for.
	if run.SettleSource.String != "stream_error" || run.InTok == 0 || run.ChargedMicro == 0 {
		t.Errorf("run settled %s in=%d charged=%d, want stream_error charged the prompt's estimate",
			run.SettleSource.String, run.InTok, run.ChargedMicro)
	}
}
