package proxy_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestPlainCallInADoubleFaultIsChargedItsUsage: Redis is out of reach for a moment when a
// plain call's tally is written, and the database stays out of reach for longer than the
// call's settlement tries (settle_timeout). Redis is back within that time. DESIGN §3: a
// settlement that gives up leaves the hold to expire "and the reconciler settles it from the
// tally" — so the tally must land once Redis is back, as a named run's call's does (tried
// again until settle_timeout). Written once and given up, the reconciler found no tally and
// charged the call its hold (reconcile_hold): 20 credits for a call that cost a fraction of
// one. The tally is written with the duplicate fingerprint's release before the answer's end
// (the default), or, for a tally on a client of its own (as under Redis Cluster, or
// dedup.window 0), beside the settlement.
func TestPlainCallInADoubleFaultIsChargedItsUsage(t *testing.T) {
	for _, c := range []struct {
		name        string
		fingerprint bool // the tally rides with the fingerprint's release; else it goes beside the settlement
	}{
		{"tally with the fingerprint", true},
		{"tally beside the settlement", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var down atomic.Bool
			blip := wrappedDialer(func(conn net.Conn) net.Conn { return blipConn{conn, &down} })
			dsn, lossyDB := testenv.LossyMySQLDSN(t)
			setup := harnessSetup{db: testenv.Open(t, dsn)}
			if c.fingerprint {
				setup.redisDialer, setup.contextTimeouts = blip, true
			} else {
				setup.tallyDialer = blip
			}
			h := newHarnessOn(t, setup, func(c *config.Config) { c.Limits.SettleTimeout = 2 * time.Second })
			u, key := h.user("standard")
			reached, resume := h.holdAtFirst("settle")

			if !c.fingerprint {
				down.Store(true) // the tally's own client writes nothing else
			}
			resp := h.post(key, "/v1/chat/completions", streamBody,
				map[string]string{fakellm.HeaderChunks: "5", fakellm.HeaderChunkInterval: "100ms"})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("call: %d", resp.StatusCode)
			}
			runID := resp.Header.Get(proxy.RunIDHeader)
			br := bufio.NewReader(resp.Body)
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			if c.fingerprint {
				// Admitted and forwarded; Redis goes out of reach before the final event.
				down.Store(true)
			}
			readAll(t, br)
			resp.Body.Close()
			<-reached // the answer is whole; its settlement is about to start

			// A tally write has failed in the blip: only a later try can land it.
			deadline := time.Now().Add(10 * time.Second)
			for f := h.metric("tollgate_tally_failures_total"); f == "" || f == "0"; f = h.metric("tollgate_tally_failures_total") {
				if time.Now().After(deadline) {
					t.Fatal("no tally write of the call failed in the blip")
				}
				time.Sleep(time.Millisecond)
			}
			// Redis is back; the database goes out of reach for the whole settlement.
			lossyDB.TakeDown()
			down.Store(false)
			resume()
			h.settled() // the settlement has given up; the tally's tries have landed or given up
			lossyDB.Restore()
			if got := h.run(u.ID, runID); got.State == holds.StateSettled {
				t.Fatalf("run settled with the database out of reach: %+v", got)
			}

			h.reconcileExpired(t, "run_id = ?", runID)
			r := h.run(u.ID, runID)
			if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcile || r.OutTok != 5 ||
				r.ChargedMicro != fakeGPTCost(r.InTok, 5) || r.ChargedMicro >= r.HeldMicro {
				t.Fatalf("run %s settled as %s by %q, charged %d µUSD of %d held (%d in, %d out tokens); want its usage from its tally (%s)",
					runID, r.State, r.SettleSource.String, r.ChargedMicro, r.HeldMicro, r.InTok, r.OutTok, holds.SourceReconcile)
			}
			if tl, found, err := h.tally.Get(context.Background(), runID); err != nil || !found || tl.Calls != 1 {
				t.Fatalf("tally %+v found=%v err=%v: want the call counted once", tl, found, err)
			}
		})
	}
}
