package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestDrainSettlesEveryCallItLetIn storms the gateway while it drains: every call is either
// refused before anything is held (503 shutting_down) or served and settled by the time Drain
// returns. A call that entered after the drain's wait had begun was neither waited for nor
// refused: its hold outlived the process's exit (and Go's WaitGroup, counting from zero
// beside a Wait, may panic on it).
func TestDrainSettlesEveryCallItLetIn(t *testing.T) {
	h := newHarness(t, nil)
	const callers, maxCalls = 8, 200
	keys := make([]string, callers)
	for i := range keys {
		_, keys[i] = h.user("standard")
	}

	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		codes    = map[string]int{}
		served   = make(chan struct{}, callers*maxCalls)
		wg       sync.WaitGroup
	)
	for i, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < maxCalls; n++ {
				body := fmt.Sprintf(`{"model":"fake-gpt","messages":[{"role":"user","content":"drain %d-%d"}]}`, i, n)
				resp := h.post(key, "/v1/chat/completions", body, nil)
				b := readAll(t, resp.Body)
				resp.Body.Close()
				mu.Lock()
				statuses[resp.StatusCode]++
				if resp.StatusCode != http.StatusOK {
					codes[errorCode(t, b)]++
				}
				mu.Unlock()
				if resp.StatusCode == http.StatusServiceUnavailable {
					return // refused: the gateway is draining
				}
				served <- struct{}{}
			}
		}()
	}
	for range 4 * callers { // drain with calls in flight, not before the first ones
		<-served
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.srv.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if _, live := h.holdCount(); live != 0 {
		t.Fatalf("%d holds still live when Drain returned: a call it let in was not waited for", live)
	}
	wg.Wait()

	// A call after the drain is refused before its admission.
	resp := h.post(keys[0], "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"late"}]}`, nil)
	b := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, b) != "shutting_down" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("call after the drain: %d %s (Retry-After %q), want 503 shutting_down with Retry-After",
			resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	all, live := h.holdCount()
	if live != 0 || all != statuses[http.StatusOK] {
		t.Fatalf("holds: %d (%d live), want one settled per call served (%d)", all, live, statuses[http.StatusOK])
	}
	if len(statuses) != 2 || statuses[http.StatusServiceUnavailable] != callers || codes["shutting_down"] != callers {
		t.Fatalf("statuses %v, codes %v: want only 200s and each caller's one 503 shutting_down", statuses, codes)
	}
}
