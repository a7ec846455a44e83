package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestBalanceAndRunViewsSayWhenTheDatabaseIsOut: a caller whose key is cached still gets a
// clear 503 billing_unavailable from /v1/credits and /v1/runs/{id} when the database does not
// answer within admit_timeout (README's Errors table), not a hang or a 500, and the same views
// again once it answers. The key lookup's own 503 is TestKeyLookupWaitIsBounded's.
func TestBalanceAndRunViewsSayWhenTheDatabaseIsOut(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		// The stalled views answer at admit_timeout; every other call must be answered well
		// within it on a loaded machine (200 ms was the budget of the calls expected to pass
		// too, the first call's admission on a fresh pool and the views after the unlock).
		c.Limits.AdmitTimeout = 2 * time.Second
		c.Limits.KeyCacheTTL = time.Minute // the key stays cached while the tables are locked
	})
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	readAll(t, resp.Body)
	resp.Body.Close()
	runPath := "/v1/runs/" + resp.Header.Get(proxy.RunIDHeader)
	h.settled()
	for _, path := range []string{"/v1/credits", runPath} {
		if status, _ := h.get(key, path); status != http.StatusOK {
			t.Fatalf("GET %s: %d before the database stalls, want 200", path, status)
		}
	}

	// The balance's and the run's tables stall, as behind a database that stopped answering.
	ctx := context.Background()
	lock, err := h.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "LOCK TABLES users WRITE, run_holds WRITE, usage_days WRITE"); err != nil {
		t.Fatal(err)
	}
	cached := h.keyStaysCached()
	for _, path := range []string{"/v1/credits", runPath} {
		status, body := h.get(key, path)
		if code := errorCodeOf(body); status != http.StatusServiceUnavailable || code != "billing_unavailable" {
			t.Errorf("GET %s with the database stalled: %d %s, want 503 billing_unavailable", path, status, code)
		}
	}
	// A name no run can bear (past 64 characters) is refused without a read of the database:
	// 404 at once, not the stalled read's 503.
	if status, body := h.get(key, "/v1/runs/"+strings.Repeat("n", 65)); status != http.StatusNotFound ||
		errorCodeOf(body) != "run_not_found" {
		t.Errorf("GET a run by a name no run can bear, with the database stalled: %d %v, want 404 run_not_found", status, body)
	}
	cached("the views with the database stalled")
	if _, err := lock.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/credits", runPath} {
		if status, _ := h.get(key, path); status != http.StatusOK {
			t.Errorf("GET %s: %d once the database answers again, want 200", path, status)
		}
	}
}

// errorCodeOf is the code of an OpenAI-style error answer decoded as JSON, or "".
func errorCodeOf(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}
