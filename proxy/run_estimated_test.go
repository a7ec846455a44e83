package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestNamedRunKeepsItsCallsEstimatedMark: a call of a named run answered without a usage
// report is charged an estimate, as a one-call run's is; the run that settles with that
// charge must say estimated=1, or a billing team comparing the gateway's tokens with the
// provider's invoice takes the estimate for the provider's own count.
func TestNamedRunKeepsItsCallsEstimatedMark(t *testing.T) {
	h := newHarness(t, func(c *configT) { c.Plans["standard"] = bigPlan(c.Plans["standard"]) })
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"count to ten"}]}`

	// The same call as a one-call run: estimated, as the README says.
	one, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderUsage: "off"})
	if !one.Estimated || one.CostMicro == 0 {
		t.Fatalf("one-call run without a usage report: estimated=%v cost=%d, want an estimate", one.Estimated, one.CostMicro)
	}

	resp, _ := h.postOK(t, key, "/v1/chat/completions", body, map[string]string{"X-Run-Id": "est-run", fakellm.HeaderUsage: "off"}) // named run's call
	runID := resp.Header.Get("X-Tollgate-Run-Id")
	if status, out := h.settleRun(key, "est-run"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, out)
	}
	run, err := h.store.Run(context.Background(), u.ID, runID)
	if err != nil {
		t.Fatal(err)
	}
	if run.State != holds.StateSettled || run.CostMicro != one.CostMicro {
		t.Fatalf("named run %+v, want settled at the one-call run's cost %d", run, one.CostMicro)
	}
	if !run.Estimated {
		t.Errorf("named run charged %d µUSD for a call with no usage report settled with estimated=0; want 1 (its one-call twin says 1)",
			run.CostMicro)
	}
}

// TestNamedRunSettledFromItsTallyKeepsTheEstimatedMark: the row's record of a call
// (RecordRunCall) is not retried, so a database blip as the call ended leaves the run's row
// without the call's estimated mark while the tally has it (est_calls). Settled on request from
// the tally, the run must still say estimated=1, as the reconciler settling it from the same
// tally does.
func TestNamedRunSettledFromItsTallyKeepsTheEstimatedMark(t *testing.T) {
	h := newHarness(t, func(c *configT) { c.Plans["standard"] = bigPlan(c.Plans["standard"]) })
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"count to ten"}]}`
	resp, _ := h.postOK(t, key, "/v1/chat/completions", body, map[string]string{"X-Run-Id": "est-lost", fakellm.HeaderUsage: "off"}) // named run's call
	runID := resp.Header.Get("X-Tollgate-Run-Id")
	// The row as a RecordRunCall that failed leaves it: no record of the call.
	if _, err := h.db.Exec(`UPDATE run_holds SET calls = 0, ended_calls = 0, cost_micro = 0, in_tok = 0, cache_read_tok = 0,
		cache_write_tok = 0, out_tok = 0, estimated = 0 WHERE run_id = ?`, runID); err != nil {
		t.Fatal(err)
	}
	if status, out := h.settleRun(key, "est-lost"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, out)
	}
	run, err := h.store.Run(context.Background(), u.ID, runID)
	if err != nil {
		t.Fatal(err)
	}
	if run.State != holds.StateSettled || run.CostMicro == 0 || run.SettleSource.String != holds.SourceClient {
		t.Fatalf("named run %+v, want settled on request at its tally's estimate", run)
	}
	if !run.Estimated {
		t.Errorf("named run charged %d µUSD from a tally counting 1 estimated call settled with estimated=0; want 1", run.CostMicro)
	}
}
