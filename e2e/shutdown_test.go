package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestSigtermSettlesEverything: SIGTERM while streams are in flight. The gateway lets the
// short streams finish inside shutdown_timeout, cuts the long ones at the deadline, waits for
// every settlement and exits 0 — within the drain plus settle_timeout (10 s here) plus the 5 s
// it allows itself to stop. No other process runs a reconciler here: every run must have been
// settled by the process itself, none left live, no lease left.
func TestSigtermSettlesEverything(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term", 10, nil)
	g := w.startGateway("gw-term")

	// Short streams end well inside the 2 s drain; long ones would run for minutes.
	var short, long []*stream
	for range 3 {
		short = append(short, startStream(t, g, key, 20, 50*time.Millisecond, nil))
	}
	for range 3 {
		long = append(long, startStream(t, g, key, 10_000, 20*time.Millisecond, nil))
	}
	sentAt := time.Now()
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, testShutdownDrain+15*time.Second); err != nil {
		t.Errorf("gateway exit after SIGTERM: %v, want status 0", err)
	}
	t.Logf("exited %v after SIGTERM (drain deadline %v)", time.Since(sentAt).Round(time.Millisecond), testShutdownDrain)

	if n := w.liveHolds(); n != 0 {
		t.Fatalf("%d holds left live after a graceful shutdown", n)
	}
	for _, s := range short {
		<-s.done
		r := w.hold(s.runID)
		if r.SettleSource.String != holds.SourceComplete || s.err != nil || s.chunks < 20 {
			t.Errorf("short stream %s: source %q, client read %d events (err %v); want it finished and settled complete",
				s.runID, r.SettleSource.String, s.chunks, s.err)
		}
		if r.ChargedMicro <= 0 || r.Estimated {
			t.Errorf("short stream %s: charged %d estimated %v, want its reported usage", s.runID, r.ChargedMicro, r.Estimated)
		}
	}
	for _, s := range long {
		<-s.done
		r := w.hold(s.runID)
		src := r.SettleSource.String
		if src != holds.SourceShutdown {
			t.Errorf("long stream %s: settled by %q, want cut at the deadline (shutdown)", s.runID, src)
		}
		// What was streamed before the cut is charged, not the hold and not nothing.
		if r.ChargedMicro <= 0 || r.OutTok <= 0 || r.ChargedMicro >= r.HeldMicro {
			t.Errorf("long stream %s: charged %d for %d output tokens (held %d); want what it used", s.runID, r.ChargedMicro, r.OutTok, r.HeldMicro)
		}
		t.Logf("long stream cut: %s, %d output tokens, charged %d µUSD (estimated %v), client read %d events",
			src, r.OutTok, r.ChargedMicro, r.Estimated, s.chunks)
	}
	// Leases were dropped at settlement: nothing is left for a reconciler to wonder about.
	leases, err := w.rdb.Keys(context.Background(), w.prefix+"lease:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 0 {
		t.Errorf("leases left after shutdown: %v", leases)
	}
	var settled int
	if err := w.db.Get(&settled, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND state = 'settled'", u.ID); err != nil {
		t.Fatal(err)
	}
	if settled != len(short)+len(long) {
		t.Errorf("%d runs settled, want %d", settled, len(short)+len(long))
	}
}
