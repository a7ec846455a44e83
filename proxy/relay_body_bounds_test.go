package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// TestAnswerOfExactlyMaxResponseBytesIsRelayed: max_response_bytes is the largest answer the
// gateway relays, not the first it refuses. An answer of exactly that many bytes, by its
// Content-Length or read to its end without one, is the provider's answer: relayed 200 as it
// came and charged its report. Refused, it was a 502 upstream_response_too_large that no SDK
// retries, for an answer the caller paid for; a byte more is refused, as the limit says.
func TestAnswerOfExactlyMaxResponseBytesIsRelayed(t *testing.T) {
	const limit = 16 << 10
	answer := func(size int) string {
		head := `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"`
		tail := `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`
		return head + strings.Repeat("w", size-len(head)-len(tail)) + tail
	}
	up := &fixedUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "fixed", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
		c.Limits.MaxResponseBytes = limit
	})
	for _, length := range []bool{true, false} {
		body := answer(limit)
		up.set(body, length)
		u, key := h.user("standard")
		status, got, run := h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
		if status != http.StatusOK || string(got) != body {
			t.Errorf("%d bytes (Content-Length %v): %d %.200s, want it relayed 200 as it came", limit, length, status, got)
		}
		if run.SettleSource.String != holds.SourceComplete || run.Estimated || run.InTok != 10 || run.OutTok != 20 ||
			run.ChargedMicro != fakeGPTCost(10, 20) {
			t.Errorf("%d bytes (Content-Length %v): run source=%s estimated=%v in=%d out=%d charged=%d, want complete, its report, charged %d",
				limit, length, run.SettleSource.String, run.Estimated, run.InTok, run.OutTok, run.ChargedMicro, fakeGPTCost(10, 20))
		}

		up.set(answer(limit+1), length)
		u, key = h.user("standard")
		status, got, _ = h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
		if status != http.StatusBadGateway || errorCode(t, got) != "upstream_response_too_large" {
			t.Errorf("%d bytes (Content-Length %v): %d %.200s, want 502 upstream_response_too_large", limit+1, length, status, got)
		}
	}
}

// TestAnswerBrokenAtExactlyMaxResponseBytesIsBroken: an answer whose Content-Length is past
// max_response_bytes but whose body breaks once exactly that many bytes came was never shown
// to be too large: it broke, and is answered as an answer that broke (502 upstream_broken,
// which its caller may retry), charged the output it had sent. Told it was too large, its
// caller was told not to retry an answer a retry might well get whole.
func TestAnswerBrokenAtExactlyMaxResponseBytesIsBroken(t *testing.T) {
	const limit = 32 << 10
	up := &cutUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "cut", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
		c.Limits.MaxResponseBytes = limit
	})
	head := `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"`
	body := head + strings.Repeat("words ", limit/3) + `"},"finish_reason":"stop"}]}`
	for _, send := range []int{limit - 1, limit} {
		up.set(body, send, "length")
		u, key := h.user("standard")
		status, got, run := h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
		if status != http.StatusBadGateway || errorCode(t, got) != "upstream_broken" {
			t.Errorf("broken after %d bytes of %d: %d %.200s, want 502 upstream_broken", send, len(body), status, got)
		}
		if run.SettleSource.String != holds.SourceStreamError || !run.Estimated || run.OutTok <= 0 {
			t.Errorf("broken after %d bytes: run source=%s estimated=%v out=%d, want stream_error, its output read estimated",
				send, run.SettleSource.String, run.Estimated, run.OutTok)
		}
	}
}
