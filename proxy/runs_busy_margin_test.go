package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
)

// TestRunSettleWithoutATallyIsBusyForTheLongestCallAndItsMargin: a named run settled on request
// with no tally and no recorded call may still have its first call running, between its
// admission and its reservation: it is run_busy for as long as a call can live — its upstream
// call, one more write to a slow client, and a minute's margin for its tally and settlement
// (maxCall). Without the margin a run past upstream_timeout + client_write_timeout was charged
// its whole hold while that call could still be writing its tally.
func TestRunSettleWithoutATallyIsBusyForTheLongestCallAndItsMargin(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "in-the-margin"})
	readAll(t, resp.Body)
	resp.Body.Close()
	runID := resp.Header.Get(proxy.RunIDHeader)
	if resp.StatusCode != http.StatusOK || runID == "" {
		t.Fatalf("call: %d, run id %q", resp.StatusCode, runID)
	}
	h.settled()
	// The run's evidence of its call is gone (its tally, and its row's record of it), as for a
	// run whose first call has not reserved yet.
	if err := h.rdb.Del(context.Background(), h.keys.Usage(runID)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.Exec(`UPDATE run_holds SET calls = 0, cost_micro = 0, in_tok = 0, cache_read_tok = 0,
		cache_write_tok = 0, out_tok = 0, ended_calls = 0 WHERE run_id = ?`, runID); err != nil {
		t.Fatal(err)
	}
	// Older than upstream_timeout + client_write_timeout by half the margin: within it.
	age := h.cfg.Limits.UpstreamTimeout + h.cfg.Limits.ClientWriteTimeout + 30*time.Second
	if _, err := h.db.Exec("UPDATE run_holds SET created_at = created_at - INTERVAL ? MICROSECOND WHERE run_id = ?",
		age.Microseconds(), runID); err != nil {
		t.Fatal(err)
	}
	if status, body := h.settleRun(key, "in-the-margin"); status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Fatalf("settle of a run without a tally %v old: %d %s, run %+v; want 409 run_busy", age, status, body, h.run(u.ID, runID))
	}
}
