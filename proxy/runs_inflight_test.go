package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestNamedRunCallsRespectMaxInFlight: a user limited to one call in flight may not run
// any number of calls at once by naming a run.
func TestNamedRunCallsRespectMaxInFlight(t *testing.T) {
	h := newHarness(t, nil)
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
	hdr := map[string]string{"X-Run-Id": "task-wide", fakellm.HeaderChunks: "20", fakellm.HeaderChunkInterval: "25ms"}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		ok int
	)
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := h.post(key, "/v1/chat/completions", body, hdr)
			b := readAll(t, resp.Body)
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode == http.StatusOK && !strings.Contains(string(b), "error") {
				ok++
			}
		}()
	}
	wg.Wait()
	if ok > one {
		t.Fatalf("%d calls of one run served at once for a user whose max_in_flight is %d", ok, one)
	}
}
