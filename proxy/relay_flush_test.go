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
	runID := postThroughStall(t, h, key, "", "Hello billing team", nil)
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

// TestNothingReadAfterAFailedFlushIsActedOn: the rest of the answer — its usage and its end —
// comes from the upstream while the flush of its first event is stalled by the caller, and
// sits read by the gateway's client when the flush fails. The caller left before it: the call
// ends cancelled, charged the estimate of what it was sent, as when nothing more had been read
// — not complete, charged usage its caller never saw, its Idempotency-Key pinned to an answer
// its caller never had.
func TestNothingReadAfterAFailedFlushIsActedOn(t *testing.T) {
	for _, idem := range []string{"", "left-before-the-end"} {
		t.Run("idempotency key "+strconv.Quote(idem), func(t *testing.T) {
			began := make(chan struct{})
			upstream := func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, hostileChunk)
				w.(http.Flusher).Flush()
				select {
				case <-began: // the gateway's flush of that event waits on the caller
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, hostileUsage+"data: [DONE]\n\n")
			}
			h := hostileHarness(t, upstream, func(c *config.Config) { c.Limits.ClientWriteTimeout = time.Second })
			u, key := h.user("standard")
			runID := postThroughStall(t, h, key, idem, "Hello billing team", began)
			h.waitSettled(runID, 20*time.Second, "its caller's flush failed")
			r := h.run(u.ID, runID)
			if r.SettleSource.String != holds.SourceCancel || r.OutTok >= 400 {
				t.Errorf("run settled by %q with %d output tokens: want cancelled, charged the estimate of the one event sent (the 400 reported came after the caller left)",
					r.SettleSource.String, r.OutTok)
			}
		})
	}
}

// TestAnswerEndUnsentIsNoCompleteAnswer: the upstream's last bytes — the usage and [DONE] —
// come with its end, and the caller stops reading just then: the flush that carries [DONE]
// fails. The caller did not get the answer's end, so the call is cancelled, as it was when
// each event was flushed on its own, not complete.
func TestAnswerEndUnsentIsNoCompleteAnswer(t *testing.T) {
	h := hostileHarness(t, scriptedUpstream("text/event-stream", step{s: hostileChunk + hostileUsage + "data: [DONE]\n\n"}),
		func(c *config.Config) { c.Limits.ClientWriteTimeout = time.Second })
	u, key := h.user("standard")
	runID := postThroughStall(t, h, key, "", "[DONE]", nil)
	h.waitSettled(runID, 20*time.Second, "its caller's flush failed")
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceCancel {
		t.Errorf("run settled by %q, want %q: the caller never had the answer's end", r.SettleSource.String, holds.SourceCancel)
	}
}

// postThroughStall streams a chat call from h through a listener whose connection stalls the
// first write containing marker until its write deadline (began, if set, is closed as it
// starts to), and returns the call's run id. The caller reads whatever comes.
func postThroughStall(t *testing.T, h *harness, key, idem, marker string, began chan struct{}) string {
	t.Helper()
	resp, _ := callThroughStall(t, h, key, streamBody, idem, marker, began)
	go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
	return resp.Header.Get(proxy.RunIDHeader)
}

// streamThroughStall is postThroughStall for a caller that reads the answer in the background
// as it comes, and the answer's headers.
func streamThroughStall(t *testing.T, h *harness, key, marker string) (*http.Response, *callerReader) {
	t.Helper()
	resp, _ := callThroughStall(t, h, key, streamBody, "", marker, nil)
	return resp, readInBackground(resp.Body)
}

// callThroughStall sends a chat call of body the way postThroughStall does, and returns its
// answer, unread, and the listener (its stalled channel says whether a write stalled).
func callThroughStall(t *testing.T, h *harness, key, body, idem, marker string, began chan struct{}) (*http.Response, *endStallListener) {
	t.Helper()
	ln := &endStallListener{Listener: newLoopbackListener(t), stalled: make(chan error, 1), release: make(chan struct{}),
		stalls: func(p []byte) bool { return bytes.Contains(p, []byte(marker)) }, began: began}
	gw := httptest.NewUnstartedServer(h.srv.Handler())
	gw.Listener.Close()
	gw.Listener = ln
	gw.Start()
	t.Cleanup(gw.Close)
	t.Cleanup(func() { close(ln.release) })
	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	if idem != "" {
		req.Header.Set(proxy.IdempotencyKeyHeader, idem)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, ln
}

// TestEventsBeforeTheEndDoNotWaitForItsRedisWork: the answer's last event and the events
// before it come in one read. The end's work — the tally that rides with the fingerprint's
// release, before [DONE] goes out — waits on Redis, held back here until the caller has the
// event before the end: that event must not wait for it. (Held unflushed behind the end's
// round trips, it reached the caller only once Redis answered, up to their bounds.)
func TestEventsBeforeTheEndDoNotWaitForItsRedisWork(t *testing.T) {
	redisGate := newWriteGate("write_seq") // the end's tally (its figures set by a script that names its seq field)
	t.Cleanup(redisGate.open)
	upstreamGate := make(chan struct{})
	var once sync.Once
	releaseUpstream := func() { once.Do(func() { close(upstreamGate) }) }
	t.Cleanup(releaseUpstream)
	second := strings.Replace(hostileChunk, "Hello billing team", "The second event", 1)
	upstream := httptest.NewServer(scriptedUpstream("text/event-stream",
		step{s: hostileChunk}, step{gate: upstreamGate}, step{s: second + hostileUsage + "data: [DONE]\n\n"}))
	t.Cleanup(upstream.Close)
	h := newHarnessOn(t, harnessSetup{redisDialer: redisGate.dial}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "hostile", Kind: "openai", BaseURL: upstream.URL, Models: []string{"*"}}}
	})
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	defer resp.Body.Close()
	cr := readInBackground(resp.Body)
	if !cr.waitFor("Hello billing team", 20*time.Second) {
		t.Fatalf("the first event never reached the caller; it had %q", cr.bytes())
	}
	releaseUpstream()
	got := cr.waitFor("The second event", 20*time.Second)
	held := redisGate.held()
	redisGate.open()
	if !got {
		t.Fatalf("the event before the answer's end did not reach the caller while the end's tally waited on Redis (%d write held); caller had %q",
			held, cr.bytes())
	}
	<-cr.done
	runID := resp.Header.Get(proxy.RunIDHeader)
	h.waitSettled(runID, 20*time.Second, "its answer ended")
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceComplete || r.OutTok != 400 {
		t.Errorf("run settled by %q with %d output tokens, want complete with the 400 reported", r.SettleSource.String, r.OutTok)
	}
}

// TestAnswerEndSentIsCompleteThoughTheCallerLeavesAfter: the caller has the answer's end — a
// flush carried [DONE] to it — and stops reading before what the upstream sends after it (a
// keep-alive comment, here) goes out: that flush fails. The caller had its whole answer, so the
// call is complete, charged its report, not cancelled as one whose end it never had.
func TestAnswerEndSentIsCompleteThoughTheCallerLeavesAfter(t *testing.T) {
	const after = ": after-the-end\n\n"
	afterGate := make(chan struct{})
	var once sync.Once
	releaseAfter := func() { once.Do(func() { close(afterGate) }) }
	t.Cleanup(releaseAfter)
	h := hostileHarness(t, scriptedUpstream("text/event-stream",
		step{s: hostileChunk + hostileUsage + "data: [DONE]\n\n"}, step{gate: afterGate}, step{s: after}),
		func(c *config.Config) { c.Limits.ClientWriteTimeout = time.Second })
	u, key := h.user("standard")
	resp, cr := streamThroughStall(t, h, key, "after-the-end")
	if !cr.waitFor("data: [DONE]", 10*time.Second) {
		t.Fatalf("the caller never had [DONE]: %q", cr.bytes())
	}
	releaseAfter() // the upstream's comment comes only once the caller has the answer's end
	runID := resp.Header.Get(proxy.RunIDHeader)
	h.waitSettled(runID, 20*time.Second, "its caller's flush failed after the answer's end")
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceComplete || r.OutTok != 400 {
		t.Errorf("run settled by %q with %d output tokens, want %q and the 400 reported: the caller had the whole answer",
			r.SettleSource.String, r.OutTok, holds.SourceComplete)
	}
}

// TestCallerLeavingAfterTheProvidersErrorEventIsNoCancel: the provider ended the answer with
// its error event before any output, the caller had it, and stopped reading before what the
// upstream sent after it (a keep-alive comment) went out: that flush fails. The caller leaving
// after the answer's end is no cancel: the call settles upstream_error at 0, as when the
// upstream closes first, not charged its prompt's estimate as a cancel.
func TestCallerLeavingAfterTheProvidersErrorEventIsNoCancel(t *testing.T) {
	afterGate := make(chan struct{})
	var once sync.Once
	releaseAfter := func() { once.Do(func() { close(afterGate) }) }
	t.Cleanup(releaseAfter)
	h := hostileHarness(t, scriptedUpstream("text/event-stream",
		step{s: "data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n"},
		step{gate: afterGate}, step{s: ": after-the-error\n\n"}),
		func(c *config.Config) { c.Limits.ClientWriteTimeout = time.Second })
	u, key := h.user("standard")
	resp, cr := streamThroughStall(t, h, key, "after-the-error")
	if !cr.waitFor("The server had an error", 10*time.Second) {
		t.Fatalf("the caller never had the provider's error event: %q", cr.bytes())
	}
	releaseAfter()
	runID := resp.Header.Get(proxy.RunIDHeader)
	h.waitSettled(runID, 20*time.Second, "its caller's flush failed after the provider's error event")
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceUpstreamError || r.ChargedMicro != 0 {
		t.Errorf("run settled by %q, charged %d µUSD, want %q at 0: the provider failed before any output",
			r.SettleSource.String, r.ChargedMicro, holds.SourceUpstreamError)
	}
}
