package proxy_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"fmt"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// An upstream that compresses its answer in an encoding the gateway never asked for (the
// transport asks for gzip only, and decodes it): the meter cannot read the usage or the text,
// yet the caller, whose client decodes deflate, gets the whole answer.
func TestHostileUnaskedEncodingIsNotServedUncharged(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "deflate")
		fw, _ := flate.NewWriter(w, flate.BestSpeed)
		for i := 0; i < 5; i++ {
			fmt.Fprint(fw, hostileChunk)
		}
		fmt.Fprint(fw, hostileUsage)
		fmt.Fprint(fw, "data: [DONE]\n\n")
		fw.Close()
	}, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	t.Logf("status %d, Content-Encoding %q, %d bytes; run in=%d out=%d est=%v src=%s charged=%d",
		resp.StatusCode, resp.Header.Get("Content-Encoding"), len(body), run.InTok, run.OutTok, run.Estimated, run.SettleSource.String, run.ChargedMicro)
	if resp.StatusCode == http.StatusOK && run.OutTok == 0 {
		t.Fatalf("the caller was served the whole (%s-encoded) answer; the call was charged output 0", resp.Header.Get("Content-Encoding"))
	}
	// Refused, the call is charged its prompt's estimate (the provider had the prompt); an
	// SDK's automatic retries would each get the same encoding and be charged again.
	if resp.StatusCode == http.StatusBadGateway && resp.Header.Get("X-Should-Retry") != "false" {
		t.Errorf("502 for an encoding not asked for says X-Should-Retry %q, want false", resp.Header.Get("X-Should-Retry"))
	}
}

// gzip is what the transport asks for and decodes: such an answer is served and metered.
func TestHostileGzipAnswerIsDecodedAndMetered(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept-Encoding") != "gzip" {
			t.Errorf("upstream asked for %q", r.Header.Get("Accept-Encoding"))
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprint(zw, hostileChunk)
		fmt.Fprint(zw, hostileUsage)
		fmt.Fprint(zw, "data: [DONE]\n\n")
		zw.Close()
	}, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, map[string]string{"Accept-Encoding": "br"})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" || run.OutTok != 400 {
		t.Fatalf("status %d encoding %q body %.100s; run out=%d, want the answer decoded and its usage charged",
			resp.StatusCode, resp.Header.Get("Content-Encoding"), body, run.OutTok)
	}
}

// An answer whose Content-Encoding lists more than the one gzip the gateway asked for, over
// several header lines (RFC 9110 §5.3: one list, as if comma-joined) — gzip twice (a
// compressing proxy in front of a server that compressed already), or identity then br: the
// transport read the first line alone, decoded one gzip (or none, taking "identity" for the
// whole) and passed on bytes the meter cannot read. A stream was relayed 200 as complete,
// charged its prompt's estimate with no output (the caller's client, given the remaining
// Content-Encoding, could decode it all); a whole answer was taken for no API answer and
// charged nothing. Either is an answer in an encoding not asked for: 502 upstream_broken,
// charged the prompt's estimate, not to be retried.
func TestHostileStackedEncodingsAreNotServedUncharged(t *testing.T) {
	gz := func(b []byte) []byte {
		var out bytes.Buffer
		zw := gzip.NewWriter(&out)
		zw.Write(b)
		zw.Close()
		return out.Bytes()
	}
	br := func(b []byte) []byte { return append([]byte{0xce, 0xb2, 0xcf}, b...) } // bytes, not plain text
	for _, tc := range []struct {
		name    string
		codings []string
		encode  func([]byte) []byte
		stream  bool
		reqBody string
		ctype   string
		plain   string
	}{
		{"gzip twice, stream", []string{"gzip", "gzip"}, func(b []byte) []byte { return gz(gz(b)) }, true, streamBody, "text/event-stream",
			hostileChunk + hostileUsage + "data: [DONE]\n\n"},
		{"gzip twice, whole", []string{"gzip", "gzip"}, func(b []byte) []byte { return gz(gz(b)) }, false, chatBody, "application/json", plainAnswer},
		{"identity then br, stream", []string{"identity", "br"}, br, true, streamBody, "text/event-stream",
			hostileChunk + hostileUsage + "data: [DONE]\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				w.Header()["Content-Encoding"] = tc.codings
				w.Write(tc.encode([]byte(tc.plain)))
			}, nil)
			u, key := h.user("standard")
			resp := h.post(key, "/v1/chat/completions", tc.reqBody, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_broken" {
				t.Fatalf("status %d, Content-Encoding %q, body %q; want 502 upstream_broken", resp.StatusCode,
					resp.Header.Values("Content-Encoding"), body[:min(len(body), 120)])
			}
			if resp.Header.Get("X-Should-Retry") != "false" {
				t.Errorf("X-Should-Retry %q, want false", resp.Header.Get("X-Should-Retry"))
			}
			if run.SettleSource.String != "stream_error" || run.ChargedMicro == 0 {
				t.Errorf("run settled %s, charged %d: want stream_error charged the prompt's estimate", run.SettleSource.String, run.ChargedMicro)
			}
		})
	}
}

// TestHostileXGzipAnswerIsDecodedAndMetered: x-gzip is gzip under its older name (RFC 9110
// §8.4.1.3: a recipient should read it as gzip). An answer so labelled was taken for one in an
// encoding the gateway did not ask for: refused 502 upstream_broken and charged its prompt's
// estimate (stream_error), though the gateway could read it; a token count so answered was
// 502 too. It is decoded and metered as gzip is.
func TestHostileXGzipAnswerIsDecodedAndMetered(t *testing.T) {
	var packed bytes.Buffer
	zw := gzip.NewWriter(&packed)
	fmt.Fprint(zw, plainAnswer)
	zw.Close()
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "X-Gzip")
		w.Write(packed.Bytes())
	}, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" || string(body) != plainAnswer {
		t.Fatalf("status %d encoding %q body %.120s: want the x-gzip answer decoded and relayed",
			resp.StatusCode, resp.Header.Get("Content-Encoding"), body)
	}
	if run.SettleSource.String != "complete" || run.Estimated || run.InTok != 10 || run.OutTok != 5 {
		t.Errorf("run settled %s estimated=%v in=%d out=%d: want complete with the reported 10 in, 5 out",
			run.SettleSource.String, run.Estimated, run.InTok, run.OutTok)
	}
}
