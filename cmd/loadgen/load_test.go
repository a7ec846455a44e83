package main

import (
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
