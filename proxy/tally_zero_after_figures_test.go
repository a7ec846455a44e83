package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// errorAfterFinalUpstream streams a chat answer that produced nothing and reported no usage,
// its final event ([DONE]), then the provider's error event.
func errorAfterFinalUpstream(t *testing.T) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			"data: " + `{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":"stop"}]}` + "\n\n",
			"data: [DONE]\n\n",
			"event: error\ndata: " + `{"error":{"message":"overloaded","type":"server_error"}}` + "\n\n",
		} {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// TestPlainCallSettledAtZeroAfterItsTallyHadFiguresInADoubleFault: a plain stream is tallied
// at its final event ([DONE]) at what it is charged then (no usage reported: the prompt's
// estimate), and the provider's error event comes after it: the call, which produced nothing,
// is settled at 0 as the upstream's failure (upstream_error). Its settlement fails (the
// database out of reach for all its settle_timeout), and the reconciler settles the run from
// its tally, which must say what the settlement would have charged: nothing. The zero tally
// written beside the settlement (MarkCallUnused) leaves the figures already there, and the
// reconciler charged the prompt's estimate for a call its own process settles at 0.
func TestPlainCallSettledAtZeroAfterItsTallyHadFiguresInADoubleFault(t *testing.T) {
	dsn, lossyDB := testenv.LossyMySQLDSN(t)
	h := newHarnessOn(t, harnessSetup{db: testenv.Open(t, dsn)}, func(c *config.Config) {
		c.Upstreams[0].BaseURL = errorAfterFinalUpstream(t)
		c.Limits.SettleTimeout = 2 * time.Second
	})
	u, key := h.user("standard")
	final, resume := h.holdAtFirst("answer final")
	resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %d", resp.StatusCode)
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	<-final // tallied with its fingerprint's release, at the final event
	if tl, found, err := h.tally.Get(context.Background(), runID); err != nil || !found || tl.CostMicro == 0 {
		t.Fatalf("tally at the final event %+v found=%v err=%v: the test's premise is a tally with figures", tl, found, err)
	}
	lossyDB.TakeDown()
	resume()
	readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()
	lossyDB.Restore()
	if got := h.run(u.ID, runID); got.State == holds.StateSettled {
		t.Fatalf("run settled with the database out of reach: %+v", got)
	}
	tl, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found {
		t.Fatalf("tally %+v found=%v err=%v", tl, found, err)
	}
	h.reconcileExpired(t, "run_id = ?", runID)
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.ChargedMicro != 0 || r.CostMicro != 0 {
		t.Fatalf("run %s settled as %s by %q at %d µUSD charged %d (tally %+v); want 0, as the call's own settlement (upstream_error)",
			runID, r.State, r.SettleSource.String, r.CostMicro, r.ChargedMicro, tl)
	}
	if tl.CostMicro != 0 || tl.Source != holds.SourceUpstreamError {
		t.Fatalf("tally %+v: want nothing used, its settlement's source %q", tl, holds.SourceUpstreamError)
	}
}
