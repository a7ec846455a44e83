package e2e

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// twinLine is what a process logs on finding another live process under its own instance name.
const twinLine = "another live gateway process serves under this instance name"

// TestTwinInstanceNameIsReported: two live gateways started under one TOLLGATE_INSTANCE (a
// copied unit file, a replica count raised under a fixed name). README says each live process
// must have its own: they share their leases and the reconcile lock. Each process says so in
// its log, at error level, naming the other's row, instead of serving on silently; a process
// restarted under the name of one that was killed (which README says is fine) says nothing,
// though the dead one's row is still there until it is found dead. Meanwhile the twins serve
// one named run together, a long call on one outliving the run's TTL while the other's calls
// end (each of whose lease releases deletes the lease the two share): the run is not settled
// under the long call, and its one charge counts every call.
func TestTwinInstanceNameIsReported(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("twins", 10, nil)
	cfg := w.writeConfig(map[string]string{"holds.dead_instance_after": "8s"})
	a := w.startGatewayWith("gw-a", cfg, "TOLLGATE_INSTANCE=gw-twin")
	b := w.startGatewayWith("gw-b", cfg, "TOLLGATE_INSTANCE=gw-twin")

	const name = "twin-run"
	run := map[string]string{"X-Run-Id": name}
	runID, first := completeCall(t, b, key, chatBody(false, 40, "first"), with(run, "X-Fake-Chunks", "10"))
	long := startStream(t, a, key, 250, 20*time.Millisecond, run) // 5 s: past the run's 3 s TTL
	calls := 2
	// What the calls answered whole cost, each at its price (a run's cost is the sum of its
	// calls', each rounded on its own); the long stream's is checked from what is left.
	whole, wholeCost := first, w.price.Cost(first)
	for done := false; !done; {
		select {
		case <-long.done:
			done = true
			continue
		default:
		}
		_, use := completeCall(t, b, key, chatBody(false, 40, "step"), with(run, "X-Fake-Chunks", "5"))
		calls++
		whole, wholeCost = whole.Add(use), wholeCost+w.price.Cost(use)
		if r := w.hold(runID); r.State != holds.StateRunning {
			t.Fatalf("run settled (%s) under its long call on the twin", r.SettleSource.String)
		}
	}
	if long.err != nil || long.last != "data: [DONE]" {
		t.Fatalf("long call: ended %v, last %q", long.err, long.last)
	}
	view := settleRunWhenFree(t, b, key, name)
	r := w.hold(runID)
	longUse := pricing.Usage{Input: r.InTok - whole.Input, Output: r.OutTok - whole.Output}
	if view["state"] != "settled" || r.Calls != calls || longUse.Output != 250 || longUse.Input <= 0 ||
		r.CostMicro != wholeCost+w.price.Cost(longUse) || r.ChargedMicro != r.CostMicro {
		t.Errorf("run: %s by %q, %d calls, %d in / %d out, cost %d charged %d; want settled with %d calls: those answered whole "+
			"(%d in / %d out, %d) and the long one's 250 out, each at its price", r.State, r.SettleSource.String, r.Calls,
			r.InTok, r.OutTok, r.CostMicro, r.ChargedMicro, calls, whole.Input, whole.Output, wholeCost)
	}
	if got, r := w.ledgerUsed(u.ID), w.hold(runID); got != r.ChargedMicro {
		t.Errorf("day ledger %d, want the run's charge %d", got, r.ChargedMicro)
	}

	for _, g := range []*gateway{a, b} {
		waitFor(t, 30*time.Second, g.name+" to report its twin", func() bool { return logHas(t, g, twinLine) })
		// And to show it in its metrics, for an alert that lasts as long as the twin does.
		waitFor(t, 30*time.Second, g.name+" to count its twin", func() bool { return metricValue(scrape(t, g), "tollgate_instance_twins") == 1 })
	}

	// A restart under a killed process's name is no twin.
	c := w.startGatewayWith("gw-c", cfg)
	var oldID string
	if err := w.db.Get(&oldID, "SELECT id FROM instances WHERE name = 'gw-c'"); err != nil {
		t.Fatal(err)
	}
	c.signal(t, syscall.SIGKILL)
	<-c.done
	c2 := w.startGatewayWith("gw-c2", cfg, "TOLLGATE_INSTANCE=gw-c")
	// The old row is found dead once a process has watched its beat stand still past its
	// bound: the restarted process has watched it all along by then.
	waitFor(t, 60*time.Second, "the killed process's row to be found dead", func() bool {
		var dead bool
		if err := w.db.Get(&dead, "SELECT dead_at IS NOT NULL FROM instances WHERE id = ?", oldID); err != nil {
			t.Fatal(err)
		}
		return dead
	})
	if logHas(t, c2, twinLine) {
		t.Errorf("a process restarted under a killed one's name reported a twin")
	}
	if n := metricValue(scrape(t, c2), "tollgate_instance_twins"); n != 0 {
		t.Errorf("a process restarted under a killed one's name counts %v twins, want 0", n)
	}
}

// logHas reports whether g's log holds s.
func logHas(t *testing.T, g *gateway, s string) bool {
	t.Helper()
	b, err := os.ReadFile(g.log)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), s)
}
