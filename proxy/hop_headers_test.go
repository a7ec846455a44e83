package proxy_test

import (
	"net/http"
	"testing"
)

// TestConnectionListedHeadersAreHopByHop: a header named in Connection belongs to that hop
// alone (RFC 9110 §7.6.1), whichever way it goes: the caller's must not reach the upstream,
// nor the upstream's the caller. An intermediary that passes them lets either side address a
// proxy beyond the gateway with headers meant for the gateway's hop only.
func TestConnectionListedHeadersAreHopByHop(t *testing.T) {
	up, seen := recordingUpstream(http.Header{
		"Connection":     {"X-Upstream-Hop"},
		"X-Upstream-Hop": {"upstream-internal"},
		"X-Kept":         {"kept"},
	})
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	resp, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{
		"Connection":   "keep-alive, X-Caller-Hop, x-other-hop",
		"X-Caller-Hop": "for the gateway only",
		"X-Other-Hop":  "for the gateway only",
		"X-Caller":     "passes",
	})
	got := seen()
	for _, k := range []string{"X-Caller-Hop", "X-Other-Hop"} {
		if v := got.Values(k); len(v) > 0 {
			t.Errorf("header %s, named in the caller's Connection, reached the upstream: %q", k, v)
		}
	}
	if got.Get("X-Caller") != "passes" {
		t.Errorf("a caller's end-to-end header was dropped: %q", got.Get("X-Caller"))
	}
	if v := resp.Header.Values("X-Upstream-Hop"); len(v) > 0 {
		t.Errorf("header X-Upstream-Hop, named in the upstream's Connection, reached the caller: %q", v)
	}
	if resp.Header.Get("X-Kept") != "kept" {
		t.Errorf("an upstream's end-to-end header was dropped: %q", resp.Header.Get("X-Kept"))
	}
}

// TestProxyAuthenticateIsHopByHop: Proxy-Authenticate is a challenge from a proxy to the client
// of its own hop (RFC 9110 §11.7.1; hop-by-hop in RFC 2616 §13.5.1 and in Go's own reverse
// proxy): one sent by a proxy in front of the upstream, to the gateway, passed on to the caller
// asks the caller's client for credentials of a proxy it never used. README "HTTP surface": the
// upstream's answer goes back without hop-by-hop headers.
func TestProxyAuthenticateIsHopByHop(t *testing.T) {
	up, _ := recordingUpstream(http.Header{
		"Proxy-Authenticate": {`Basic realm="corp-egress"`},
		"X-Kept":             {"kept"},
	})
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	resp, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, nil)
	if v := resp.Header.Values("Proxy-Authenticate"); len(v) > 0 {
		t.Errorf("the upstream's Proxy-Authenticate reached the caller: %q", v)
	}
	if resp.Header.Get("X-Kept") != "kept" {
		t.Errorf("an upstream's end-to-end header was dropped: %q", resp.Header.Get("X-Kept"))
	}
}
