package proxy_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestWideTopLevelIsRefusedBeforeAHold: a body whose top level holds more than 1024 fields is
// refused 400 invalid_json as it is read: its top
// level was indexed by key (some 100 bytes a member against a few of body), some 350 MiB for
// a 4 MiB body of short keys, before anything was held. No hold, nothing forwarded. A top
// level of 1024 fields is served.
func TestWideTopLevelIsRefusedBeforeAHold(t *testing.T) {
	h, up := jsonHarness(t)
	u, key := h.user("standard")
	wide := func(fields int) string {
		var b strings.Builder
		b.WriteString(`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]`)
		for i := 2; i < fields; i++ {
			b.WriteString(`,"x` + strconv.Itoa(i) + `":0`)
		}
		return b.String() + "}"
	}
	resp := h.post(key, "/v1/chat/completions", wide(1025), nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a top level of 1025 fields: %d %.300s, want 400", resp.StatusCode, body)
	}
	if code := errorCode(t, body); code != "invalid_json" {
		t.Errorf("a top level of 1025 fields refused with code %q, want invalid_json", code)
	}
	if n := len(h.holdsOf(u.ID)); n != 0 {
		t.Errorf("a body refused as it was read left %d holds, want none", n)
	}
	up.mu.Lock()
	forwarded := len(up.seen)
	up.mu.Unlock()
	if forwarded != 0 {
		t.Errorf("a body refused as it was read reached the upstream %d times", forwarded)
	}
	_, _ = h.postOK(t, key, "/v1/chat/completions", wide(1024), nil)
}
