package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
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

// TestInformationalFloodOverHTTP2IsBounded: 1xx answers (103 Early Hints, 102 Processing) count
// in the bound on an answer's headers. Over HTTP/1 the transport says so as it does for a final
// answer's headers, and the call is charged its prompt's estimate, not to be retried; over
// HTTP/2, which the transport speaks to a TLS upstream that offers it (the providers do), it
// says "header list too large", and the call was taken for an upstream never reached: charged
// nothing though the provider had the prompt, and retried by the SDKs, each retry the same.
func TestInformationalFloodOverHTTP2IsBounded(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			t.Errorf("the gateway reached the upstream over %s, want HTTP/2", r.Proto)
		}
		// The header map is set once, before the 103s: the HTTP/2 server encodes each 1xx's
		// headers from it on a goroutine of its own, so a handler changing it after them races
		// with that write (the race detector failed the suite on it once).
		w.Header().Set("Link", "</"+strings.Repeat("p", 4000)+">; rel=preload")
		w.Header().Set("Content-Type", "text/event-stream")
		for range 40 { // 160 KiB of 103s
			w.WriteHeader(http.StatusEarlyHints)
		}
		_, _ = w.Write([]byte(hostileChunk + hostileUsage + "data: [DONE]\n\n"))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	tr := proxy.NewTransport(config.Default().Limits)
	tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	h := newHarnessOn(t, harnessSetup{transport: tr}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "hostile", Kind: "openai", BaseURL: srv.URL, Models: []string{"*"}}}
	})
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	answer := readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, answer) != "upstream_broken" {
		t.Fatalf("status %d %s, want 502 upstream_broken", resp.StatusCode, answer)
	}
	if resp.Header.Get("X-Should-Retry") != "false" {
		t.Errorf("X-Should-Retry %q, want false: the provider answers a retry the same way", resp.Header.Get("X-Should-Retry"))
	}
	if run.SettleSource.String != "stream_error" || run.ChargedMicro == 0 {
		t.Errorf("run settled %s charged %d, want stream_error charged the prompt's estimate", run.SettleSource.String, run.ChargedMicro)
	}
}
