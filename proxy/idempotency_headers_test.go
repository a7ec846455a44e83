package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestReplayRecordBoundedByMaxReplayLen: dedup.max_replay_len is "the largest stored response";
// an upstream answer with a small body but huge headers must not store more than that in Redis
// for replay_ttl (the headers are now kept with the answer).
func TestReplayRecordBoundedByMaxReplayLen(t *testing.T) {
	// 32 KiB of one header: eight times max_replay_len, within the bound on an answer's headers
	// (64 KiB, past which the answer is refused).
	big := strings.Repeat("x", 32<<10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Padding", big)
		_, _ = w.Write([]byte(`{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`))
	}))
	t.Cleanup(up.Close)
	const limit = 4096
	h := newHarness(t, func(c *configT) { c.Upstreams[0].BaseURL = up.URL; c.Dedup.MaxReplayLen = limit })
	_, key := h.user("standard")
	hdr := map[string]string{proxy.IdempotencyKeyHeader: "replay-big-headers"}
	h.postOK(t, key, "/v1/chat/completions", chatBody, hdr)
	h.settled()
	ctx := context.Background()
	keys, err := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("replay records %v %v", keys, err)
	}
	hl, _ := h.rdb.HStrLen(ctx, keys[0], "hdrs").Result()
	rl, _ := h.rdb.HStrLen(ctx, keys[0], "resp").Result()
	if hl+rl > limit {
		t.Errorf("replay record keeps %d bytes of headers + %d of body for replay_ttl, max_replay_len %d", hl, rl, limit)
	}
	again := h.post(key, "/v1/chat/completions", chatBody, hdr)
	_, _ = io.ReadAll(again.Body)
	again.Body.Close()
	t.Logf("replay: %d, X-Padding %d bytes", again.StatusCode, len(again.Header.Get("X-Padding")))
}
