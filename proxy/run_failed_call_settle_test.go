package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestNamedRunSettledTheMomentItsFailedCallIsAnsweredChargesIt: a named run's call the upstream
// refused (503, answered 502) gives its reservation back with its zero tally before its answer
// reaches the caller (finishRunCall tallies in the request, not in the background): an agent
// that settles its run the moment that answer arrives is answered 200, charged its earlier
// call alone, not refused 409 run_busy for a call that has ended. (No h.settled() between: it
// would wait for a background tally and hide one left to it.)
func TestNamedRunSettledTheMomentItsFailedCallIsAnsweredChargesIt(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const name = "agent-failed-then-settle"
	run := map[string]string{"X-Run-Id": name}
	resp, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, run) // first call
	runID := resp.Header.Get(proxy.RunIDHeader)
	h.settled()
	first := h.run(u.ID, runID)

	resp = h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": name, fakellm.HeaderStatus: "503"})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_error" {
		t.Fatalf("refused call: %d %s, want 502 upstream_error", resp.StatusCode, body)
	}
	if status, body := h.settleRun(key, name); status != http.StatusOK {
		t.Fatalf("settle the moment the failed call was answered: %d %s, want 200", status, body)
	}
	h.settled()
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.ChargedMicro != first.CostMicro || r.ChargedMicro == 0 {
		t.Fatalf("run %+v: want settled at its first call's cost %d", r, first.CostMicro)
	}
}
