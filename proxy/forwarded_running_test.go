package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// TestForwardedCallIsHeldAsRunning: DESIGN §3 step 3 — a call forwarded at once is inserted as
// running. The state is what the reconciler goes by when a killed process left no tally
// (DESIGN §5): running is settled at its hold, what the caller authorised, while queued is
// released at 0; a forwarded call held as queued would be served for free. Every kind of call
// is looked at while its upstream call is under way: a plain one, one with an
// Idempotency-Key, one of a session, and a named run's first call.
func TestForwardedCallIsHeldAsRunning(t *testing.T) {
	h, gate, _ := gatedObservedHarness(t, config.Upstream{Name: "gate-openai", Kind: "openai", Models: []string{"*"}})
	for _, c := range []struct {
		name string
		hdr  map[string]string
	}{
		{"plain", nil},
		{"idempotent", map[string]string{"Idempotency-Key": "held-running"}},
		{"session", map[string]string{"X-Session-Id": "held-running"}},
		{"named run", map[string]string{"X-Run-Id": "held-running"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, key := h.user("standard")
			done := make(chan answer, 1)
			go func() { done <- send(h.gw.URL, key, chatBody, with(c.hdr, "X-Test-Gate", c.name)) }()
			gate.await(t, c.name, 1)
			var states []string
			if err := h.db.Select(&states, "SELECT state FROM run_holds WHERE user_id = ?", u.ID); err != nil {
				t.Fatal(err)
			}
			if len(states) != 1 || holds.State(states[0]) != holds.StateRunning {
				t.Errorf("holds of the call under way: %v, want one running", states)
			}
			gate.open(c.name)
			if a := <-done; a.err != nil || a.status != http.StatusOK {
				t.Fatalf("%d %v %s", a.status, a.err, a.body)
			}
			if c.hdr["X-Run-Id"] != "" {
				if status, body := h.settleRun(key, c.hdr["X-Run-Id"]); status != http.StatusOK {
					t.Fatalf("settle: %d %s", status, body)
				}
			}
		})
	}
}
