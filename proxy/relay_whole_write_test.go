package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestPinnedWholeAnswerWhoseWriteFailsStaysComplete: an Idempotency-Key attempt's whole
// answer is stored on its key before it goes out (pinBeforeAnswer), and then its write to the
// caller fails (the caller stops reading partway). The key already answers every retry with
// that answer, as complete, so the call settles complete, charged its report, as its record
// says: not as a cancel, a call its caller left, whose answer its key replays in full.
func TestPinnedWholeAnswerWhoseWriteFailsStaysComplete(t *testing.T) {
	const marker = " stall-here"
	// The head is past what the server buffers before its first write to the connection, so
	// the caller has the answer's headers (its run id) before the write that stalls.
	content := strings.Repeat("a", 16000) + strings.Repeat(marker, 5000)
	answer := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		content + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":400,"total_tokens":410}}`
	h := hostileHarness(t, scriptedUpstream("application/json", step{s: answer}),
		func(c *config.Config) { c.Limits.ClientWriteTimeout = time.Second })
	u, key := h.user("standard")
	resp, ln := callThroughStall(t, h, key, chatBody, "pinned-then-left", marker, nil)
	go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
	runID := resp.Header.Get(proxy.RunIDHeader)
	if runID == "" {
		t.Fatalf("no run id on the answer (status %d)", resp.StatusCode)
	}
	h.waitSettled(runID, 20*time.Second, "its caller's write failed after its key was pinned")
	select {
	case <-ln.stalled: // the answer's write ran out of time before the call ended
	default:
		t.Fatal("the answer's write to the caller never stalled: nothing failed")
	}
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceComplete || r.OutTok != 400 {
		t.Errorf("run settled by %q with %d output tokens, want %q with the 400 reported: its key holds the whole answer",
			r.SettleSource.String, r.OutTok, holds.SourceComplete)
	}
}

// TestNamedRunWholeCallIsTalliedBeforeItsAnswerGoesOut: a named run's non-stream call is
// tallied, the run's own way (tallyBeforeAnswer: its tally, its row's record, its lease given
// back), before its answer goes out, as its stream's is at its final event: a caller that
// settles its run the moment it has the answer finds the call in the run's tally. Probed as
// the answer is marked final, just before it is written.
func TestNamedRunWholeCallIsTalliedBeforeItsAnswerGoesOut(t *testing.T) {
	h := fixedAnswerHarness(t, false, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello billing team"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":400,"total_tokens":410}}`)
	u, key := h.user("standard")
	runID := proxy.RunIDFor(u.ID, "task-whole")
	final, resume := h.holdAtFirst("answer final")
	sent := make(chan answer, 1)
	go func() { sent <- send(h.gw.URL, key, chatBody, map[string]string{"X-Run-Id": "task-whole"}) }()
	<-final
	tallied, found, err := h.tally.Get(context.Background(), runID)
	resume()
	if a := <-sent; a.err != nil || a.status != http.StatusOK {
		t.Fatalf("call: %d %v %s", a.status, a.err, a.body)
	}
	if err != nil || !found || tallied.Calls != 1 || tallied.Usage.Output != 400 || tallied.CostMicro != fakeGPTCost(10, 400) {
		t.Errorf("tally of run %s as its answer was marked final: %+v found=%v err=%v; want its one call's 400 output tokens, cost %d",
			runID, tallied, found, err, fakeGPTCost(10, 400))
	}
}

// TestSessionWholeAnswerIsMarkedEndedBeforeItGoesOut: a session's non-stream call marks its
// answer final (the session's end mark, endSessionCall) before the answer's bytes go out, as a
// stream does at its final event: the same message sent again the moment its caller has the
// answer (a regenerate) must find the call ended, not already_running. Seen from both sides:
// the mark's write reaches Redis before any byte of the answer reaches the caller's
// connection. (Left to the handler's deferred end, it went out after the answer was flushed.)
func TestSessionWholeAnswerIsMarkedEndedBeforeItGoesOut(t *testing.T) {
	const said = "Hello billing team"
	upstream := httptest.NewServer(func() http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`+said+
				`"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":400,"total_tokens":410}}`)
		}
	}())
	t.Cleanup(upstream.Close)
	var answered atomic.Bool // a byte of the answer went to the caller's connection
	var marks atomic.Int32   // session end marks written (SET sessdone:{run})
	var markAfterAnswer atomic.Bool
	dial := wrappedDialer(func(c net.Conn) net.Conn {
		return &watchedConn{Conn: c, saw: func(p []byte) {
			if bytes.Contains(p, []byte("\r\nset\r\n")) && bytes.Contains(p, []byte("sessdone:{")) {
				marks.Add(1)
				if answered.Load() {
					markAfterAnswer.Store(true)
				}
			}
		}}
	})
	h := newHarnessOn(t, harnessSetup{redisDialer: dial}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "hostile", Kind: "openai", BaseURL: upstream.URL, Models: []string{"*"}}}
	})
	_, key := h.user("standard")
	ln := &endStallListener{Listener: newLoopbackListener(t), stalled: make(chan error, 1), release: make(chan struct{}),
		stalls: func(p []byte) bool {
			if bytes.Contains(p, []byte(said)) {
				answered.Store(true)
			}
			return false // watched, never stalled
		}}
	gw := httptest.NewUnstartedServer(h.srv.Handler())
	gw.Listener.Close()
	gw.Listener = ln
	gw.Start()
	t.Cleanup(gw.Close)
	a := send(gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: "whole-answer-marked"})
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(string(a.body), said) {
		t.Fatalf("call: %d %v %s", a.status, a.err, a.body)
	}
	h.settled()
	if marks.Load() == 0 {
		t.Fatal("the session call's end was never marked")
	}
	if markAfterAnswer.Load() {
		t.Error("the session call's end was marked only after its answer went to the caller: the same message sent on the answer is already_running")
	}
}

// watchedConn is a Redis connection that shows saw every write before it is made.
type watchedConn struct {
	net.Conn
	saw func(p []byte)
}

func (c *watchedConn) Write(p []byte) (int, error) {
	c.saw(p)
	return c.Conn.Write(p)
}
