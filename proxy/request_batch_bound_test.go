package proxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestCompletionsBatchOfTooManyPromptsIsRefusedBeforeAHold: every prompt of a /v1/completions
// batch is kept apart while the body is read (its estimate, its echo, its task in the meter),
// before anything is held and for any key; a 4 MiB body of empty prompts ("",""...) allocated
// some 190 MiB and kept 40 MiB, past the bound on bodies in memory. A batch of more than 2048
// prompts is refused 400 as it is read: no hold, nothing forwarded. One of 2048 is served.
func TestCompletionsBatchOfTooManyPromptsIsRefusedBeforeAHold(t *testing.T) {
	h, up := jsonHarness(t)
	u, key := h.user("standard")
	batch := func(n int) string {
		return `{"model":"fake-gpt","echo":true,"max_tokens":1,"prompt":["a"` + strings.Repeat(`,"a"`, n-1) + `]}`
	}

	resp := h.post(key, "/v1/completions", batch(2049), nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a batch of 2049 prompts: %d %.300s, want 400", resp.StatusCode, body)
	}
	if code := errorCode(t, body); code != "too_many_prompts" {
		t.Errorf("a batch of 2049 prompts refused with code %q, want too_many_prompts", code)
	}
	if n := len(h.holdsOf(u.ID)); n != 0 {
		t.Errorf("a batch refused as it was read left %d holds, want none", n)
	}
	up.mu.Lock()
	forwarded := len(up.seen)
	up.mu.Unlock()
	if forwarded != 0 {
		t.Errorf("a batch refused as it was read reached the upstream %d times", forwarded)
	}

	_, _ = h.postOK(t, key, "/v1/completions", batch(2048), nil)
	if got := len(up.last(t).Get("prompt").Array()); got != 2048 {
		t.Errorf("a batch of 2048 prompts reached the upstream with %d", got)
	}
}
