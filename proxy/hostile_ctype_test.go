package proxy_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// Media types are case-insensitive (RFC 9110 §8.3.1): an upstream that labels its stream
// "Text/Event-Stream" is still streaming, and must be relayed as a stream — each event when it
// arrives, and without the usage chunk the gateway asked for on the caller's behalf.
func TestEventStreamContentTypeIsCaseInsensitive(t *testing.T) {
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	h := hostileHarness(t, scriptedUpstream("Text/Event-Stream; charset=utf-8",
		step{s: hostileChunk}, step{gate: gate}, step{s: hostileUsage}, step{s: "data: [DONE]\n\n"},
	), nil)
	u, key := h.user("standard")
	// Posted in the background: a gateway that buffers the stream sends not even its headers
	// before the upstream ends.
	resps := make(chan *http.Response, 1)
	go func() { resps <- h.post(key, "/v1/chat/completions", streamBody, nil) }()
	var resp *http.Response
	got := false
	select {
	case resp = <-resps:
		cr := readInBackground(resp.Body)
		got = cr.waitFor(hostileChunk, 5*time.Second)
		release()
		<-cr.done
		resp.Body.Close()
		if want := hostileChunk + "data: [DONE]\n\n"; string(cr.bytes()) != want {
			t.Errorf("caller received %q, want %q (the usage chunk it did not ask for removed)", cr.bytes(), want)
		}
	case <-time.After(5 * time.Second):
		release()
		resp = <-resps
		body := readAll(t, resp.Body)
		resp.Body.Close()
		t.Errorf("no answer headers while the upstream waited; once it ended the caller received %q", body)
	}
	if !got {
		t.Errorf("the first event did not reach the caller while the upstream waited (Content-Type %q)", "Text/Event-Stream; charset=utf-8")
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if run.SettleSource.String != holds.SourceComplete || run.OutTok != 400 {
		t.Errorf("run settled by %q out=%d", run.SettleSource.String, run.OutTok)
	}
}
