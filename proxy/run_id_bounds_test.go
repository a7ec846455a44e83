package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestRunIDTakesTheDesignsCharactersUpTo64: DESIGN §4 — X-Run-Id is 1–64 characters of
// [A-Za-z0-9._:-]. A name of 64 using every class of them names a run its caller can read and
// settle by that name; 65, or one character outside the set, is 400 invalid_run_id with
// nothing held.
func TestRunIDTakesTheDesignsCharactersUpTo64(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const classes = "Az09._:-"
	longest := classes + strings.Repeat("k", 64-len(classes))
	for _, name := range []string{longest, "a", "task:7.retry-2_B"} {
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": name})
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("X-Run-Id %q (%d characters): %d %s, want 200", name, len(name), resp.StatusCode, body)
		}
		if status, answer := h.settleRun(key, name); status != http.StatusOK {
			t.Fatalf("settle %q: %d %s", name, status, answer)
		}
		if r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); r.State != holds.StateSettled || r.Calls != 1 {
			t.Errorf("run %q: %s with %d calls, want settled with its call", name, r.State, r.Calls)
		}
	}
	for _, name := range []string{longest + "k", "a/b", "a b", "a+b", "run#1", "é"} {
		h.postRefused(t, key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": name}, http.StatusBadRequest, "invalid_run_id")
	}
}
