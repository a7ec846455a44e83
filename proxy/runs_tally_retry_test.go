package proxy_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/proxy"
)

// blipConn fails every write while its switch is on: Redis out of reach for a moment.
type blipConn struct {
	net.Conn
	down *atomic.Bool
}

func (c blipConn) Write(b []byte) (int, error) {
	if c.down.Load() {
		c.Conn.Close()
		return 0, errors.New("redis blip")
	}
	return c.Conn.Write(b)
}

type tallyUsage struct{ t *runstate.Tally }

func (u tallyUsage) Tallied(ctx context.Context, runID string) (holds.RunTally, bool, error) {
	tl, found, err := u.t.Get(ctx, runID)
	return holds.RunTally{Usage: tl.Usage, CostMicro: tl.CostMicro, Calls: tl.Calls, Estimated: tl.EstimatedCalls > 0,
		PriceSnapshot: []byte(tl.PriceSnapshot), Source: tl.Source}, found, err
}

type noLeases struct{}

func (noLeases) Exists(context.Context, string) (bool, error) { return false, nil }

type alwaysLocked struct{}

func (alwaysLocked) TryLock(context.Context) (bool, error) { return true, nil }

// reconcileExpired expires the holds of run_holds matching where (args its parameters) and
// runs one reconcile pass over them, as another process's reconciler would over a killed
// process's holds: with the harness's tallies, no lease alive, the lock its own.
func (h *harness) reconcileExpired(t *testing.T, where string, args ...any) holds.Stats {
	t.Helper()
	if _, err := h.db.Exec("UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE "+where, args...); err != nil {
		t.Fatal(err)
	}
	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally}, Leases: noLeases{},
		Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute})
	st, err := rec.RunOnce(context.Background())
	if err != nil {
		t.Fatalf("reconcile: %+v, %v", st, err)
	}
	return st
}

// TestNamedRunFirstCallRefusedInARedisBlipIsNotChargedItsHold: the first call of a named run
// is refused 503 because Redis is out of reach for a moment when it reserves its budget; it
// used nothing. README: "A failed call leaves the run open ... Nothing used is recorded as a
// zero tally, so a run nobody comes back to is settled at what it used, possibly 0". Redis is
// back once the call has been refused and a write of its tally has failed; the agent never
// returns. The run must settle at 0, not at its hold.
func TestNamedRunFirstCallRefusedInARedisBlipIsNotChargedItsHold(t *testing.T) {
	var down atomic.Bool
	h := newHarnessOn(t, harnessSetup{redisDialer: wrappedDialer(func(c net.Conn) net.Conn { return blipConn{c, &down} })}, nil)
	u, key := h.user("standard")
	// The blip lasts until the call has met it, not a set time: a call that reached Redis only
	// after a timed blip had ended would run, and nothing this test names would be checked.
	down.Store(true)
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "blip-task"})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call during the blip: %d %s, want 503", resp.StatusCode, body)
	}
	if h.fake.Calls() != 0 {
		t.Fatalf("the refused call reached the upstream")
	}
	// A write of its tally has failed in the blip: only a retry can land it.
	deadline := time.Now().Add(10 * time.Second)
	for f := h.metric("tollgate_tally_failures_total"); f == "" || f == "0"; f = h.metric("tollgate_tally_failures_total") {
		if time.Now().After(deadline) {
			t.Fatal("no tally write of the refused call failed in the blip")
		}
		time.Sleep(time.Millisecond)
	}
	down.Store(false)
	// Redis back, then every retry the gateway keeps for the call (tracked as a settlement)
	// has landed or given up: no sleep hoping that it has.
	h.settled()
	runID := resp.Header.Get(proxy.RunIDHeader)
	if runID == "" {
		if err := h.db.Get(&runID, "SELECT run_id FROM run_holds WHERE user_id = ?", u.ID); err != nil {
			t.Fatal(err)
		}
	}
	if tl, found, err := h.tally.Get(context.Background(), runID); err != nil || !found || tl.CostMicro != 0 {
		t.Fatalf("tally of the run after the blip: %+v found=%v err=%v; want the zero tally the gateway retried until it landed", tl, found, err)
	}

	// The agent never comes back: the run expires and is reconciled (DESIGN §5).
	h.reconcileExpired(t, "run_id = ?", runID)
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.ChargedMicro != 0 {
		t.Fatalf("run whose only call was refused 503 settled as %s, charged %d µUSD (source %s); want 0",
			r.State, r.ChargedMicro, r.SettleSource.String)
	}
}
