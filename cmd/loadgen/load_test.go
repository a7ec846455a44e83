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
// slowest requests are the likeliest to be in flight then.
func TestLoadKeepsRequestsInFlightAtTheEnd(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			time.Sleep(300 * time.Millisecond)
		}
		_, _ = w.Write([]byte("{}"))
	}))
	defer srv.Close()
	l := load{conns: 2, d: 200 * time.Millisecond, spec: func(w, j int) reqSpec {
		if w == 0 {
			return reqSpec{key: "k", body: []byte("{}"), headers: map[string]string{"X-Slow": "1"}}
		}
		return reqSpec{key: "k", body: []byte("{}")}
	}}
	res := l.run(newClient(2), srv.URL)
	slow := 0
	for _, s := range res.samples {
		if s.ok && s.lat >= 300*time.Millisecond {
			slow++
		}
	}
	if slow == 0 || res.cut != 0 || !res.timeUp {
		t.Fatalf("slow answers kept %d, cut %d, timeUp %v", slow, res.cut, res.timeUp)
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
