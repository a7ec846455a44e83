package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestEveryRedisKeyTheGatewayWritesLapses: README § Sizing Redis says every key the gateway
// writes lapses at its TTL, so what Redis holds follows the calls of the last days, not the
// gateway's age. After one of each kind of request — plain, streamed, an Idempotency-Key's
// and its replay, a named run's calls and settle, a session's message, one replaced as it
// ran, a Responses answer, an Anthropic message, a token count, refusals (a wrong key, bad
// JSON, a wrong run id, a settled run's call), readiness — every key under the gateway's
// prefix has an expiry: a key
// written without one (a new record, a write after an error that skipped its EXPIRE) would
// stay for good, one per call.
func TestEveryRedisKeyTheGatewayWritesLapses(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	send := func(path, body string, hdr map[string]string) int {
		t.Helper()
		resp := h.post(key, path, body, hdr)
		readAll(t, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path, body string
		hdr        map[string]string
	}{
		{"/v1/chat/completions", chatBody, nil},
		{"/v1/chat/completions", streamBody, nil},
		{"/v1/chat/completions", chatBody, map[string]string{proxy.IdempotencyKeyHeader: "lapse-1"}},
		{"/v1/chat/completions", chatBody, map[string]string{proxy.IdempotencyKeyHeader: "lapse-1"}}, // replayed
		{"/v1/chat/completions", streamBody, map[string]string{proxy.IdempotencyKeyHeader: "lapse-2"}},
		{"/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "lapse-run"}},
		{"/v1/chat/completions", streamBody, map[string]string{"X-Run-Id": "lapse-run"}},
		{"/v1/chat/completions", chatBody, map[string]string{proxy.SessionHeader: "lapse-session"}},
		{"/v1/responses", `{"model":"fake-gpt","input":"hi"}`, nil},
		{"/v1/messages", `{"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"/v1/messages/count_tokens", `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"/v1/chat/completions", `{"model":`, nil},
	} {
		send(c.path, c.body, c.hdr)
	}
	// A session's message replaced while it streams: its cancel leaves a mark.
	replaced := h.post(key, "/v1/chat/completions", streamBody,
		map[string]string{proxy.SessionHeader: "lapse-replaced", fakellm.HeaderChunks: "2000", fakellm.HeaderChunkInterval: "5ms"})
	rd := afterContent(t, replaced, 3)
	if status := send("/v1/chat/completions", chatBody, map[string]string{proxy.SessionHeader: "lapse-replaced"}); status != http.StatusOK {
		t.Fatalf("the replacing message: %d", status)
	}
	if rest := readAll(t, rd); !strings.Contains(string(rest), `"code":"superseded"`) {
		t.Fatalf("the replaced message was not stopped: ...%s", rest[max(0, len(rest)-300):])
	}
	replaced.Body.Close()
	if n, err := h.rdb.Exists(context.Background(), h.keys.Cancelled(replaced.Header.Get(proxy.RunIDHeader))).Result(); err != nil || n != 1 {
		t.Fatalf("cancel mark of the replaced run: exists %d (%v), want it written", n, err)
	}
	if status, body := h.settleRun(key, "lapse-run"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if status := send("/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "lapse-run"}); status != http.StatusConflict {
		t.Fatalf("call on the settled run: %d, want 409", status)
	}
	if status, _ := h.settleRun(key, "no-such-run"); status != http.StatusNotFound {
		t.Fatalf("settle of no run: %d, want 404", status)
	}
	if resp := h.post("tg_wrong", "/v1/chat/completions", chatBody, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong key: %d, want 401", resp.StatusCode)
	} else {
		resp.Body.Close()
	}
	if resp, err := http.Get(h.gw.URL + "/readyz"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	h.settled()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var keys, lasting []string
	iter := h.rdb.Scan(ctx, 0, h.keys.Prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		ttl, err := h.rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl == -1 { // -2: gone since the scan, lapsed or deleted
			lasting = append(lasting, strings.TrimPrefix(k, h.keys.Prefix))
		}
	}
	if len(keys) < 10 {
		t.Fatalf("%d keys under the prefix after the calls, want their tallies and records at least: %q", len(keys), keys)
	}
	if len(lasting) > 0 {
		t.Fatalf("%d of %d keys have no expiry: %q", len(lasting), len(keys), lasting)
	}
}
