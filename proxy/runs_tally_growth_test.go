package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestNamedRunTallyDoesNotGrowWithCalls: the mark that makes a call's tally safe to repeat was
// a done:<call id> field of the run's tally hash, which lives tally_ttl (48 h) and is pushed out
// by each call. Calls that cost nothing (an upstream 400) do not use the run's cap, so nothing
// bounded how many a run makes: the hash grew by one field per call, for ever. The mark is a
// key of its own now, living as long as a call.
func TestNamedRunTallyDoesNotGrowWithCalls(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	const calls = 100
	var runID string
	for range calls {
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "grow-task", "X-Fake-Status": "400"})
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("call: %d %s, want the upstream's 400", resp.StatusCode, body)
		}
		runID = resp.Header.Get(proxy.RunIDHeader)
	}
	h.settled()
	ctx := context.Background()
	n, err := h.rdb.HLen(ctx, h.keys.Usage(runID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	ttl := h.rdb.PTTL(ctx, h.keys.Usage(runID)).Val()
	t.Logf("tally hash of run %s after %d calls: %d fields, ttl %v", runID, calls, n, ttl)
	if n > 16 {
		t.Fatalf("the run's tally hash holds %d fields after %d calls that used nothing (ttl %v): it grows by one per call", n, calls, ttl)
	}
}
