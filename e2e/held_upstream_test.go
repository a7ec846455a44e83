package e2e

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
)

// heldUpstream stands in front of the world's fakellm. A call whose request carries
// X-Test-Hold-Stream: name gets its answer's first write through (a stream's first event) and
// then waits, mid-stream, until the test lets name go or the gateway gives up on the call: a
// test keeps its streams running for as long as its next steps take, where a stream paced by
// X-Fake-Chunk-Interval alone ends in a fixed time a loaded machine can outlast. (The proxy
// package's tests hold theirs the same way, with their gateUpstream; test files are not shared
// between packages.)
type heldUpstream struct {
	fake  http.Handler
	mu    sync.Mutex
	gates map[string]chan struct{}
	calls atomic.Int64 // requests that reached the upstream: a test of a call never forwarded reads it
}

func newHeldUpstream(fake http.Handler) *heldUpstream {
	return &heldUpstream{fake: fake, gates: map[string]chan struct{}{}}
}

// gate is the channel the calls held at name wait on; closed when the test lets them go.
func (u *heldUpstream) gate(name string) chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	g, ok := u.gates[name]
	if !ok {
		g = make(chan struct{})
		u.gates[name] = g
	}
	return g
}

func (u *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.calls.Add(1)
	if name := r.Header.Get("X-Test-Hold-Stream"); name != "" {
		w = &heldStream{ResponseWriter: w, open: u.gate(name), ctx: r.Context()}
	}
	u.fake.ServeHTTP(w, r)
}

// holdStreams is hdr asking the world's upstream to hold its calls mid-stream at name, after
// their first event, and the func that lets them all go on (once; at the test's end at the
// latest, before the upstream closes).
func (w *world) holdStreams(name string, hdr map[string]string) (map[string]string, func()) {
	open := w.held.gate(name)
	var once sync.Once
	letGo := func() { once.Do(func() { close(open) }) }
	w.t.Cleanup(letGo)
	out := map[string]string{"X-Test-Hold-Stream": name}
	for k, v := range hdr {
		out[k] = v
	}
	return out, letGo
}

// heldStream lets an answer's first write through and holds the next ones until open is closed
// or ctx (the upstream request's) ends.
type heldStream struct {
	http.ResponseWriter
	open  <-chan struct{}
	ctx   context.Context
	wrote bool
}

func (h *heldStream) Write(p []byte) (int, error) {
	if h.wrote {
		select {
		case <-h.open:
		case <-h.ctx.Done():
			return 0, h.ctx.Err()
		}
	}
	h.wrote = true
	return h.ResponseWriter.Write(p)
}

// Unwrap lets fakellm's http.ResponseController flush the answer's writes.
func (h *heldStream) Unwrap() http.ResponseWriter { return h.ResponseWriter }
