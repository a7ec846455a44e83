package proxy_test

import (
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestOneCallMovesTheSeriesTheREADMENames: README § Operating it names what one answered call
// moves: tollgate_requests_total{route,code}, tollgate_settlements_total{source,applied} (a
// gateway's settlement of its own call), tollgate_settle_seconds (call end to settled row) and
// the two parts of the admit phase, admit_queue and admit_tx; tollgate_active_calls is back at 0.
func TestOneCallMovesTheSeriesTheREADMENames(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	resp, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, nil)
	h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	want := map[string]string{
		`tollgate_requests_total{code="200",route="/v1/chat/completions"}`: "1",
		`tollgate_settlements_total{applied="true",source="complete"}`:     "1",
		`tollgate_settle_seconds_count`:                                    "1",
		`tollgate_call_phase_seconds_count{phase="admit_queue"}`:           "1",
		`tollgate_call_phase_seconds_count{phase="admit_tx"}`:              "1",
		`tollgate_active_calls`:                                            "0",
		`tollgate_settle_failures_total`:                                   "0",
	}
	// The request is counted as its handler returns and the settlement is counted in the
	// background: either may come after the caller has its answer.
	waitFor(t, "the call and its settlement to be counted", func() bool {
		return h.metric(`tollgate_settlements_total{applied="true",source="complete"}`) == "1" &&
			h.metric(`tollgate_requests_total{code="200",route="/v1/chat/completions"}`) == "1"
	})
	for series, v := range want {
		if got := h.metric(series); got != v {
			t.Errorf("%s = %q after one answered call, want %q", series, got, v)
		}
	}
}
