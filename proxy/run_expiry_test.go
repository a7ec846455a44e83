package proxy_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestEachCallOfARunPushesItsExpiryOut: DESIGN §4 — each call of a named run pushes the run's
// expires_at to now + run_ttl (by the database clock), and does not settle it: an agent whose
// calls keep coming is never reconciled under them. TestHoldsExpireAfterTheirOwnTTL holds the
// first call's expiry; here the run's expiry is brought to a minute away, as if it had idled
// most of its run_ttl, and its next call must push it back out to run_ttl from then.
func TestEachCallOfARunPushesItsExpiryOut(t *testing.T) {
	const runTTL = 13 * time.Minute
	h := newHarness(t, func(c *config.Config) { c.Holds.RunTTL = runTTL })
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "agent-keeps-going"}
	var runID string
	for call := 1; call <= 3; call++ {
		resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"step `+strconv.Itoa(call)+`"}]}`, run)
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: %d %s", call, resp.StatusCode, answer)
		}
		runID = resp.Header.Get(proxy.RunIDHeader)
		h.settled()
		var state string
		var left int64
		if err := h.db.QueryRow("SELECT state, TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at) FROM run_holds WHERE run_id = ?", runID).
			Scan(&state, &left); err != nil {
			t.Fatal(err)
		}
		// At most run_ttl from now; at least run_ttl from just before the call, which took
		// well under a minute.
		if d := time.Duration(left) * time.Microsecond; d > runTTL || d < runTTL-time.Minute {
			t.Errorf("call %d: the run expires in %v, want run_ttl (%v) from the call", call, d, runTTL)
		}
		if holds.State(state) != holds.StateRunning {
			t.Errorf("call %d: the run is %s; a run's calls do not settle it", call, state)
		}
		// Idle for most of its run_ttl: a minute left.
		if _, err := h.db.Exec("UPDATE run_holds SET expires_at = NOW(6) + INTERVAL 1 MINUTE WHERE run_id = ?", runID); err != nil {
			t.Fatal(err)
		}
	}
	if status, body := h.settleRun(key, "agent-keeps-going"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 3 {
		t.Errorf("run after its settle: %s with %d calls, want settled with 3", r.State, r.Calls)
	}
}
