package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestNamedRunIsFoundByItsNameEscaped: a run name may hold ':' ("agent:42"), which a client
// that builds its URL with encodeURIComponent (JavaScript, the OpenAI Node SDK's path helper)
// or Python's quote(name, safe="") sends as %3A. The router matches the raw path, so the
// name reached the lookup still escaped and GET and settle answered 404 run_not_found for a
// run that exists: it stayed open until run_ttl, for the reconciler.
func TestNamedRunIsFoundByItsNameEscaped(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "agent:42"})
	readAll(t, resp.Body)
	resp.Body.Close()
	id := resp.Header.Get("X-Tollgate-Run-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("call: %d, run id %q", resp.StatusCode, id)
	}
	if status, got := h.get(key, "/v1/runs/agent%3A42"); status != http.StatusOK || got["id"] != id {
		t.Fatalf("GET /v1/runs/agent%%3A42: %d %v, want 200 with run %s", status, got, id)
	}
	if status, body := h.settleRun(key, "agent%3a42"); status != http.StatusOK {
		t.Fatalf("settle /v1/runs/agent%%3a42: %d %s, want 200", status, body)
	}
	if r := h.run(u.ID, id); r.State != holds.StateSettled || r.Calls != 1 {
		t.Fatalf("run %+v, want settled with its call", r)
	}
}
