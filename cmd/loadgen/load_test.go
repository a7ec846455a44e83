package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// A request in flight when the load's time is up is answered and kept, not dropped: the
// slowest requests are the likeliest to be in flight then. The request is sent at once and its
// answer held until the load's time is certainly up (d from its arrival, which is after the
// load's start); that it was sent before the deadline and answered after it is then checked on
// the sample itself.
func TestLoadKeepsRequestsInFlightAtTheEnd(t *testing.T) {
	const d = time.Second
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The load's own clock, not a guess at an event: its deadline is at most d after
		// this request arrived.
		<-time.After(d)
		_, _ = w.Write([]byte("{}"))
	}))
	defer srv.Close()
	l := load{conns: 1, d: d, spec: func(w, j int) reqSpec {
		return reqSpec{key: "k", body: []byte("{}")}
	}}
	res := l.run(newClient(1), srv.URL)
	if len(res.samples) != 1 || res.cut != 0 || !res.timeUp {
		t.Fatalf("samples %d, cut %d, timeUp %v; want the one request kept, nothing cut, the time up", len(res.samples), res.cut, res.timeUp)
	}
	s := res.samples[0]
	sent := s.end.Add(-s.lat)
	if !s.ok || !sent.Before(res.deadline) || !s.end.After(res.deadline) {
		t.Fatalf("sample ok=%v sent %v and answered %v around the deadline %v; want an answer kept that was sent before it and came after it",
			s.ok, sent.Sub(res.deadline), s.end.Sub(res.deadline), res.deadline)
	}
}

// A stream the server cuts after two of its five chunks is an error that lost three events
// and never saw [DONE]: the stream figures must say so, not count it whole.
func TestCutStreamCountsItsLostEvents(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 1; i <= 2; i++ {
			_, _ = fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i)
		}
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	defer srv.Close()
	s := do(context.Background(), newClient(1), srv.URL, reqSpec{key: "k", body: []byte("{}"), stream: true, chunks: 5})
	if s.ok || s.errKind == "" {
		t.Fatalf("cut stream ok=%v errKind %q", s.ok, s.errKind)
	}
	if s.lost != 3 || !s.noDone {
		t.Errorf("cut stream: lost %d (want 3), noDone %v (want true)", s.lost, s.noDone)
	}
}
