package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// halfClosedCall sends a stream request on a raw connection and shuts down its sending side
// (net/http reads the half-close as the caller leaving and cancels the request) when before
// returns, at once when before is nil, then reads the answer to its end. before may read the
// answer's head itself (read), and returns it if it did.
func halfClosedCall(t *testing.T, h *harness, key string, before func(read func() (*http.Response, error)) *http.Response) (*http.Response, string) {
	t.Helper()
	return halfClosedRequest(t, h, "/v1/chat/completions", "Authorization: Bearer "+key, streamBody, before)
}

// halfClosedRequest is halfClosedCall's request to any path, authenticated by the header line
// auth (an Anthropic route's "X-Api-Key: …", say).
func halfClosedRequest(t *testing.T, h *harness, path, auth, body string, before func(read func() (*http.Response, error)) *http.Response) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: gw\r\n%s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, auth, len(body), body)
	br := bufio.NewReader(c)
	read := func() (*http.Response, error) { return http.ReadResponse(br, nil) }
	var resp *http.Response
	if before != nil {
		resp = before(read)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	if resp == nil {
		if resp, err = read(); err != nil {
			t.Fatal(err)
		}
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v (read %q)", err, rest)
	}
	return resp, string(rest)
}

// onSignal is a halfClosedRequest's before that waits for in (an answer's headers reached the
// gateway, say: what) and reads nothing.
func onSignal(t *testing.T, in <-chan struct{}, what string) func(func() (*http.Response, error)) *http.Response {
	return func(func() (*http.Response, error)) *http.Response {
		select {
		case <-in:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not reach the gateway", what)
		}
		return nil
	}
}

// A caller that half-closes its connection once its request is sent is taken by net/http for
// one that left: the call is cancelled and settled as such. It still reads, though, and must
// not be handed an answer it takes for whole: neither 200 with an empty body (cancelled before
// the upstream answered) nor a stream that ends cleanly without its final event.
func TestHalfClosedCallerIsNotAnsweredAsWhole(t *testing.T) {
	t.Run("at once", func(t *testing.T) {
		// Half-closed as soon as the request is sent: whichever step the call is in when it
		// sees the caller leave, it must not answer 200.
		h, _ := halfCloseHarness(t, false)
		_, key := h.user("standard")
		resp, body := halfClosedCall(t, h, key, nil)
		if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
			t.Fatalf("a caller whose call was cancelled got %d %q, as if answered", resp.StatusCode, body)
		}
		if !strings.Contains(body, "client_closed_request") {
			t.Fatalf("answer %d %q: want client_closed_request", resp.StatusCode, body)
		}
	})
	t.Run("before the upstream's headers", func(t *testing.T) {
		// Half-closed once the upstream has the request: the call is cut in its wait for the
		// upstream's headers.
		h, received := halfCloseHarness(t, false)
		u, key := h.user("standard")
		resp, body := halfClosedCall(t, h, key, func(func() (*http.Response, error)) *http.Response {
			<-received
			return nil
		})
		if resp.StatusCode != 499 || !strings.Contains(body, "client_closed_request") {
			t.Fatalf("a caller whose call was cancelled before the upstream's headers got %d %q, want 499 client_closed_request",
				resp.StatusCode, body)
		}
		if r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); r.SettleSource.String != holds.SourceCancel {
			t.Fatalf("run %+v: want settled as cancelled", r)
		}
	})
	t.Run("mid-stream", func(t *testing.T) {
		h, _ := halfCloseHarness(t, true)
		u, key := h.user("standard")
		var first strings.Builder
		resp, body := halfClosedCall(t, h, key, func(read func() (*http.Response, error)) *http.Response {
			resp, err := read()
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(io.TeeReader(resp.Body, &first))
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("stream ended before its first event: %v", err)
				}
				if strings.Contains(line, "Hello billing team") {
					return resp
				}
			}
		})
		body = first.String() + body
		if !strings.Contains(body, "Hello billing team") || !strings.Contains(body, "client_closed_request") {
			t.Fatalf("a stream cut when its caller half-closed ended cleanly, without saying so: %q", body)
		}
		r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
		if r.SettleSource.String != holds.SourceCancel || r.OutTok == 0 {
			t.Fatalf("run %+v: want settled as cancelled, charged its output", r)
		}
	})
}

// halfCloseHarness is a gateway whose upstream takes a call (received), sends its headers and
// first event when stream is set, and then waits for the call to be cancelled.
func halfCloseHarness(t *testing.T, stream bool) (*harness, chan struct{}) {
	received := make(chan struct{}, 1)
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // (a body left unread keeps net/http from seeing the call cut)
		received <- struct{}{}
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, hostileChunk)
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
	}, func(c *config.Config) { c.Limits.UpstreamTimeout = 20 * time.Second })
	return h, received
}
