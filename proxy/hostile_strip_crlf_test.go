package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// The usage chunk the gateway asked for is removed whole, wherever the upstream's reads fall.
// Here its blank line is a CRLF whose CR ends one write and whose LF starts the next (the
// scanner hands an event on at such a CR, for streams written with CR endings, and the LF
// then leads the next event): the LF is the removed chunk's, and reached the caller, one
// byte more than the upstream's stream less the chunk, ahead of [DONE].
func TestStrippedUsageChunkLeavesNoByteBehind(t *testing.T) {
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	content := strings.Replace(hostileChunk, "\n\n", "\r\r", 1)
	usage := strings.Replace(hostileUsage, "\n\n", "\r\r", 1)
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, content+usage)
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "\ndata: [DONE]\n\n")
	}, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	cr := readInBackground(resp.Body)
	got := cr.waitFor(content, 5*time.Second)
	release()
	<-cr.done
	resp.Body.Close()
	if !got {
		t.Fatalf("the content event did not reach the caller: %q", cr.bytes())
	}
	if want := content + "data: [DONE]\n\n"; string(cr.bytes()) != want {
		t.Fatalf("caller received %q\nwant %q", cr.bytes(), want)
	}
}
