package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// step is one thing a scripted upstream does: write s and flush, or wait for gate.
type step struct {
	s    string
	gate chan struct{}
}

func scriptedUpstream(ctype string, steps ...step) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for _, st := range steps {
			if st.gate != nil {
				select {
				case <-st.gate:
				case <-r.Context().Done():
					return
				}
				continue
			}
			_, _ = io.WriteString(w, st.s)
			w.(http.Flusher).Flush()
		}
	}
}

// callerReader reads a response body in the background and lets a test wait until what the
// caller has received contains a string.
type callerReader struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	more chan struct{} // signalled after each read
	done chan struct{}
	err  error
}

func readInBackground(body io.Reader) *callerReader {
	cr := &callerReader{more: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(cr.done)
		p := make([]byte, 4096)
		for {
			n, err := body.Read(p)
			cr.mu.Lock()
			cr.buf.Write(p[:n])
			cr.mu.Unlock()
			select {
			case cr.more <- struct{}{}:
			default:
			}
			if err != nil {
				if err != io.EOF {
					cr.err = err
				}
				return
			}
		}
	}()
	return cr
}

func (cr *callerReader) bytes() []byte {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	return append([]byte(nil), cr.buf.Bytes()...)
}

// waitFor reports whether the caller has received want within the failure bound.
func (cr *callerReader) waitFor(want string, bound time.Duration) bool {
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		if bytes.Contains(cr.bytes(), []byte(want)) {
			return true
		}
		select {
		case <-cr.more:
		case <-cr.done:
			return bytes.Contains(cr.bytes(), []byte(want))
		case <-deadline.C:
			return false
		}
	}
}

// An upstream using CR-only line endings (allowed by the SSE grammar, and exercised by the
// scanner's tests) sends an event and then thinks: the caller must have the event while the
// upstream thinks, not once the next event starts.
func TestCROnlyEventReachesTheCallerWhenItArrives(t *testing.T) {
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	first := strings.ReplaceAll(hostileChunk, "\n", "\r")
	h := hostileHarness(t, scriptedUpstream("text/event-stream",
		step{s: first}, step{gate: gate},
		step{s: strings.ReplaceAll(hostileUsage, "\n", "\r")}, step{s: "data: [DONE]\r\r"},
	), nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	cr := readInBackground(resp.Body)
	got := cr.waitFor(first, 5*time.Second)
	release()
	<-cr.done
	resp.Body.Close()
	if !got {
		t.Errorf("the upstream's first event (CR line endings) did not reach the caller while the upstream waited; caller had %q", cr.bytes())
	}
	if want := first + "data: [DONE]\r\r"; string(cr.bytes()) != want {
		t.Errorf("caller received %q, want %q", cr.bytes(), want)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if run.SettleSource.String != holds.SourceComplete || run.OutTok != 400 {
		t.Errorf("run settled by %q out=%d", run.SettleSource.String, run.OutTok)
	}
}

// The same upstream, after a CR-only [DONE], neither closes nor sends anything (as
// TestHostilePlainStreamUpstreamHangsAfterDone, with LF endings): the caller must have its
// [DONE] at once and the call end within finalGrace, not at upstream_timeout. upstream_timeout
// is an hour here, so a [DONE] or an end that waited for it never comes: the bounds below
// catch that hang, they do not time the call.
func TestCROnlyDoneEndsTheCallPromptly(t *testing.T) {
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) })
	h := hostileHarness(t, scriptedUpstream("text/event-stream",
		step{s: strings.ReplaceAll(hostileChunk+hostileUsage, "\n", "\r") + "data: [DONE]\r\r"}, step{gate: gate},
	), func(c *config.Config) { c.Limits.UpstreamTimeout = time.Hour })
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	defer resp.Body.Close()
	cr := readInBackground(resp.Body)
	if !cr.waitFor("[DONE]", 30*time.Second) {
		t.Fatalf("no [DONE] within 30 s of the upstream sending it (CR line endings; upstream_timeout %v)", h.cfg.Limits.UpstreamTimeout)
	}
	select {
	case <-cr.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the call was still open 30 s after its whole answer (upstream_timeout %v): it waits for the upstream to close",
			h.cfg.Limits.UpstreamTimeout)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	t.Logf("run settled by %q out=%d", run.SettleSource.String, run.OutTok)
}

// What the caller receives is the upstream's bytes, as they come: a BOM, a comment event (while
// the upstream waits), id and retry fields, multi-line data, [DONE] twice and data after it, a
// trailing comment without its blank line, less only the usage chunk the gateway asked for
// (split across writes here). The run is charged the reported usage.
func TestStreamBytesPassThroughUnchanged(t *testing.T) {
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	pre := "\xEF\xBB\xBF: keep-alive\n\nid: 1\nretry: 1000\ndata: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\n" +
		"data: \"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n"
	post := "data: [DONE]\n\ndata: [DONE]\n\ndata: {\"after\":true}\n\n: trailing comment"
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Upstream-Trailer")
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		io.WriteString(w, pre)
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		// The usage chunk split across two writes, with a comment inside the event.
		io.WriteString(w, hostileUsage[:37])
		w.(http.Flusher).Flush()
		io.WriteString(w, hostileUsage[37:])
		io.WriteString(w, post)
		w.Header().Set("X-Upstream-Trailer", "v")
	}, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	cr := readInBackground(resp.Body)
	got := cr.waitFor(pre, 5*time.Second)
	release()
	<-cr.done
	resp.Body.Close()
	if !got {
		t.Errorf("prefix not delivered while the upstream waited: %q", cr.bytes())
	}
	if want := pre + post; string(cr.bytes()) != want {
		t.Errorf("caller received %q\nwant %q", cr.bytes(), want)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	t.Logf("trailer %v; run settled by %q in=%d out=%d est=%v charged=%d", resp.Trailer, run.SettleSource.String, run.InTok, run.OutTok, run.Estimated, run.ChargedMicro)
	if run.SettleSource.String != holds.SourceComplete || run.OutTok != 400 {
		t.Errorf("run settled by %q out=%d", run.SettleSource.String, run.OutTok)
	}
	_ = fmt.Sprint
}
