package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestNamedRunCallsRespectMaxInFlight: a user limited to one call in flight may not run
// any number of calls at once by naming a run. The burst's calls are held at the upstream
// until every one of them is either answered or held there, so that those served were all in
// flight at once: each ran for a fixed 500 ms instead, and a call a loaded machine admitted
// after the first had ended was rightly served, and counted as a second call at once.
func TestNamedRunCallsRespectMaxInFlight(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	one := 1
	if err := h.store.SetUserLimits(context.Background(), u.ID, nil, &one, nil); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"fake-gpt","max_tokens":20,"stream":true,"messages":[{"role":"user","content":"in parallel"}]}`
	// The run exists before the burst.
	first := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-wide"})
	readAll(t, first.Body)
	first.Body.Close()
	const burst = 12
	hdr := map[string]string{"X-Run-Id": "task-wide", fakellm.HeaderChunks: "20", "X-Test-Gate": "wide"}
	defer gate.open("wide")
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ok       int
		answered = make(chan struct{}, burst) // a call answered before the gate opened: refused
	)
	for range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := h.post(key, "/v1/chat/completions", body, hdr)
			answered <- struct{}{}
			b := readAll(t, resp.Body)
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode == http.StatusOK && !strings.Contains(string(b), "error") {
				ok++
			}
		}()
	}
	// A served call's answer begins only once the gate opens: until then every call is either
	// refused or held at the upstream.
	arrived := gate.gate("wide").arrived
	for settled := 0; settled < burst; settled++ {
		select {
		case <-answered:
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of the %d calls answered or at the upstream after 10 s", settled, burst)
		}
	}
	gate.open("wide")
	wg.Wait()
	if ok > one || ok == 0 {
		t.Fatalf("%d calls of one run served at once for a user whose max_in_flight is %d; want %d", ok, one, one)
	}
}
