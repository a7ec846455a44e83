package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// hostileUsageBody is a whole chat answer reporting 10 prompt and 400 completion tokens.
const hostileUsageBody = `{"id":"x","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant",` +
	`"content":"Hello billing team, here is a fairly long answer for you."},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":10,"completion_tokens":400,"total_tokens":410}}`

// A JSON answer that starts with a UTF-8 byte order mark (a .NET or Windows-hosted compatible
// server writes one; Python's json, under the OpenAI SDK, reads past it): the caller gets a
// usable answer, so the call must be charged the usage it reports, not its prompt's estimate
// with no output at all.
func TestHostileBOMBodyIsMetered(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprint(w, "\xEF\xBB\xBF"+hostileUsageBody)
	}, nil)
	u, key := h.user("standard")
	run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
	if run.OutTok != 400 || run.InTok != 10 || run.Estimated {
		t.Fatalf("run in=%d out=%d estimated=%v source=%s, want the reported 10/400",
			run.InTok, run.OutTok, run.Estimated, run.SettleSource.String)
	}
}

// closeDelimited answers with an HTTP/1.1 body delimited by the connection's close (no
// Content-Length, no chunking), as an HTTP/1.0-era server or proxy does: an upstream that dies
// mid-answer then looks, to the transport, like one that ended cleanly.
func closeDelimited(t *testing.T, ctype, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nConnection: close\r\n\r\n%s", ctype, body)
		bw.Flush()
	}
}

// A close-delimited stream cut inside its usage chunk: "completion_tokens":4 is the first digit
// of 400. Read as reported, the call is charged 4 output tokens for an answer whose streamed
// text alone is 70. The same under another label than text/event-stream (an upstream that
// leaves its Content-Type to sniffing), read whole and metered as a stream.
func TestHostileCutUsageChunkIsNotReported(t *testing.T) {
	cut := strings.Index(hostileUsage, `"completion_tokens":4`) + len(`"completion_tokens":4`)
	for _, label := range []string{"text/event-stream", "text/plain; charset=utf-8"} {
		t.Run(label, func(t *testing.T) {
			h := hostileHarness(t, closeDelimited(t, label, strings.Repeat(hostileChunk, 5)+hostileUsage[:cut]), nil)
			u, key := h.user("standard")
			status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
			t.Logf("status %d, %d bytes; run in=%d out=%d est=%v src=%s", status, len(answer), run.InTok, run.OutTok, run.Estimated, run.SettleSource.String)
			if !run.Estimated || run.OutTok < 70 {
				t.Fatalf("a usage chunk cut mid-number was billed as reported: out=%d estimated=%v, want the estimate of the text (>= 70)",
					run.OutTok, run.Estimated)
			}
		})
	}
}

// The same cut in a whole (non-streamed) answer: the caller gets JSON it cannot parse, and the
// call must not be charged the cut figures as the provider's word.
func TestHostileCutBodyIsNotReported(t *testing.T) {
	cut := strings.Index(hostileUsageBody, `"completion_tokens":4`) + len(`"completion_tokens":4`)
	h := hostileHarness(t, closeDelimited(t, "application/json", hostileUsageBody[:cut]), nil)
	u, key := h.user("standard")
	status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
	t.Logf("status %d: %.120s; run in=%d out=%d est=%v src=%s", status, answer, run.InTok, run.OutTok, run.Estimated, run.SettleSource.String)
	if !run.Estimated {
		t.Fatalf("a body cut mid-number was billed as reported: in=%d out=%d", run.InTok, run.OutTok)
	}
}

// A stream request answered whole, as JSON, under the text/event-stream label (an upstream
// that set its Content-Type from the request's stream flag, then answered or failed whole):
// no event carries data, so the stream's meter saw nothing. The answer must be charged the
// usage in it, and the provider's error charged nothing, as either is when its label says JSON.
func TestHostileStreamAnsweredWholeUnderEventStreamLabel(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		out        int64
		source     string
	}{
		{"answer", hostileUsageBody, 400, "complete"},
		{"error", `{"error":{"message":"The server had an error","type":"server_error","code":null}}` + "\n", 0, "upstream_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, tc.body)
			}, nil)
			u, key := h.user("standard")
			resp := h.post(key, "/v1/chat/completions", streamBody, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			t.Logf("status %d: %.80s; run in=%d out=%d est=%v src=%s charged=%d", resp.StatusCode, body, run.InTok, run.OutTok,
				run.Estimated, run.SettleSource.String, run.ChargedMicro)
			if string(body) != tc.body {
				t.Fatalf("the caller got %q, want the upstream's bytes", body)
			}
			if run.OutTok != tc.out || run.SettleSource.String != tc.source || (tc.source == "upstream_error") != (run.ChargedMicro == 0) {
				t.Fatalf("run out=%d source=%s charged=%d, want out=%d source=%s", run.OutTok, run.SettleSource.String, run.ChargedMicro,
					tc.out, tc.source)
			}
		})
	}
}

// TestHostileWebPageIsNoAnswer: a 200 whose body is a web page — a captive portal, a proxy's
// or CDN's page, a base_url that names a website — is no model's answer: the provider never
// saw the prompt. It was relayed as the answer and charged the prompt's estimate, on every
// call, for as long as the page stood there. It is a 502 charged nothing, for a plain call
// and a stream alike.
func TestHostileWebPageIsNoAnswer(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, "\n<!DOCTYPE html>\n<html><head><title>Sign in to the network</title></head><body>Accept the terms</body></html>\n")
	}, nil)
	u, key := h.user("standard")
	for _, body := range []string{chatBody, streamBody} {
		status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", body, nil)
		if status != http.StatusBadGateway || errorCode(t, answer) != "upstream_error" {
			t.Errorf("status %d %s, want 502 upstream_error", status, answer)
		}
		// The message says what the operator is to check: a web page is a base_url that
		// names a website, or a portal or proxy on the way.
		if !strings.Contains(string(answer), "web page") || !strings.Contains(string(answer), "base_url") {
			t.Errorf("answer %s: want it to say the upstream answered with a web page, and to ask after base_url", answer)
		}
		if run.ChargedMicro != 0 || run.SettleSource.String != "upstream_error" {
			t.Errorf("run charged %d µUSD, source %s: want 0, upstream_error", run.ChargedMicro, run.SettleSource.String)
		}
	}
}
