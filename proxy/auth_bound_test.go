package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestKeyLookupWaitIsBounded: README, 503 billing_unavailable when MySQL is "too slow to look a
// key up (5 s)". 5 s bounded one batch of lookups, not a caller's wait: with the database
// stalled, a lookup queued behind busy batches waited for a worker, then for its own batch,
// and callers piled up for as long as the stall and the queue lasted.
func TestKeyLookupWaitIsBounded(t *testing.T) {
	h := newHarness(t, nil)
	var keys []string
	for range 3 {
		_, key := h.user("standard")
		keys = append(keys, key)
	}
	// Key lookups stall behind a table lock, as behind a database that stopped answering.
	ctx := context.Background()
	lock, err := h.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "LOCK TABLES api_keys WRITE"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = lock.ExecContext(ctx, "UNLOCK TABLES") }()

	type answer struct {
		status int
		took   time.Duration
	}
	ask := func(key string) chan answer {
		out := make(chan answer, 1)
		go func() {
			start := time.Now()
			req, _ := http.NewRequest(http.MethodGet, h.gw.URL+"/v1/credits", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				out <- answer{}
				return
			}
			resp.Body.Close()
			out <- answer{resp.StatusCode, time.Since(start)}
		}()
		return out
	}
	// Both lookup workers busy, each with one stalled batch; the third lookup waits for them.
	first := ask(keys[0])
	waitKeyLookups(t, h, 1)
	second := ask(keys[1])
	waitKeyLookups(t, h, 2)
	third := <-ask(keys[2])
	t.Logf("third lookup: %d after %v", third.status, third.took)
	// Unbounded, the third waits for a worker (~5 s) and then for its own stalled batch (~5 s
	// more): 8.5 s tells the two apart with room for a loaded CI machine under -race.
	if third.status != http.StatusServiceUnavailable || third.took > 8500*time.Millisecond {
		t.Errorf("third lookup answered %d after %v, want 503 within the 5 s lookup bound", third.status, third.took)
	}
	for _, a := range []answer{<-first, <-second} {
		if a.status != http.StatusServiceUnavailable {
			t.Errorf("stalled lookup answered %d after %v, want 503", a.status, a.took)
		}
	}
}

// waitKeyLookups waits until n key lookups of this test's database are waiting.
func waitKeyLookups(t *testing.T, h *harness, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got int
		if err := h.db.Get(&got, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE ID <> CONNECTION_ID() AND DB = DATABASE() AND INFO LIKE '%FROM api_keys%' AND INFO NOT LIKE '%PROCESSLIST%'`); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d key lookups waiting, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
