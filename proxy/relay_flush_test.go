package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestBunchedEventsGoOutInOneWrite: events the upstream sends together reach the caller in one
// write — one chunk of the chunked answer, where a write per event made one chunk each — and
// before the gateway waits for the upstream again (it waits here until the caller has them).
func TestBunchedEventsGoOutInOneWrite(t *testing.T) {
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	three := hostileChunk + hostileChunk + hostileChunk
	h := hostileHarness(t, scriptedUpstream("text/event-stream",
		step{s: three}, step{gate: gate}, step{s: hostileUsage}, step{s: "data: [DONE]\n\n"},
	), nil)
	u, key := h.user("standard")

	gw, err := url.Parse(h.gw.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", gw.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A failure bound: a gateway that held the events while it waited for the upstream would
	// leave this read waiting for ever.
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", gw.Host, key, len(streamBody), streamBody)
	br := bufio.NewReader(conn)
	runID := readHeadersOfChunked(t, br)

	first := readChunk(t, br)
	if first != three {
		t.Errorf("first write to the caller: %q\nwant the three events the upstream sent together, in one chunk: %q", first, three)
	}
	release()
	var rest strings.Builder
	for {
		c := readChunk(t, br)
		if c == "" {
			break
		}
		rest.WriteString(c)
	}
	if rest.String() != "data: [DONE]\n\n" {
		t.Errorf("after the gate the caller got %q, want only [DONE] (the usage chunk it did not ask for is dropped)", rest.String())
	}
	h.waitSettled(runID, 20*time.Second, "its answer ended")
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceComplete || r.OutTok != 400 {
		t.Errorf("run settled by %q with %d output tokens, want complete with the 400 reported", r.SettleSource.String, r.OutTok)
	}
}

// TestStalledFlushStopsAWaitingUpstream: a caller that stops taking the answer is noticed at the
// flush the gateway makes before it waits for the upstream again (the event is written, not
// yet sent, when the gateway decides to read). The call ends there, as cancelled, and its
// upstream is stopped at once — not left generating, and the call holding its hold, lease and
// slot, until the upstream next sends (here: not before the test ends; upstream_timeout is an
// hour). Two things stop it: the relay, and net/http, which cancels a request's context
// when a write to its connection fails.
func TestStalledFlushStopsAWaitingUpstream(t *testing.T) {
	upstreamStopped := make(chan struct{})
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) })
	upstream := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, hostileChunk)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(upstreamStopped)
		case <-gate:
		}
	}
	h := hostileHarness(t, upstream, func(c *config.Config) {
		c.Limits.ClientWriteTimeout = time.Second
		c.Limits.UpstreamTimeout = time.Hour
	})
	u, key := h.user("standard")
	ln := &endStallListener{Listener: newLoopbackListener(t), stalled: make(chan error, 1), release: make(chan struct{}),
		stalls: func(p []byte) bool { return bytes.Contains(p, []byte("Hello billing team")) }}
	gw := httptest.NewUnstartedServer(h.srv.Handler())
	gw.Listener.Close()
	gw.Listener = ln
	gw.Start()
	t.Cleanup(gw.Close)
	t.Cleanup(func() { close(ln.release) })

	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	runID := resp.Header.Get(proxy.RunIDHeader)
	go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
	select {
	case <-upstreamStopped:
	case <-time.After(20 * time.Second):
		t.Fatalf("the upstream was still running 20 s after the flush of its event stalled (client_write_timeout %v)",
			h.cfg.Limits.ClientWriteTimeout)
	}
	h.waitSettled(runID, 20*time.Second, "its caller's flush failed")
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceCancel {
		t.Errorf("run settled by %q, want %q", r.SettleSource.String, holds.SourceCancel)
	}
}

// readHeadersOfChunked reads a 200 answer's head from br, checks it is chunked and returns its
// run id.
func readHeadersOfChunked(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("status %d, transfer encoding %v: want a chunked 200", resp.StatusCode, resp.TransferEncoding)
	}
	return resp.Header.Get(proxy.RunIDHeader)
}

// readChunk reads one chunk of a chunked body from br ("" for the last, empty, one).
func readChunk(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimRight(line, "\r\n"), 16, 64)
	if err != nil {
		t.Fatalf("chunk size line %q: %v", line, err)
	}
	b := make([]byte, n+2) // the chunk and its CRLF
	if _, err := io.ReadFull(br, b); err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}
