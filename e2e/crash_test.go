package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestKillReconciledByPeer is DESIGN §5 with real processes: gateways A and B share MariaDB
// and Redis; A serves streams, agent runs and a queued hold; A is SIGKILLed after some calls
// were tallied and in the middle of others. B's reconciler settles every run exactly once:
// from the tally where there was one, at held_micro where a running call left none, at 0 for
// the queued hold. While A lived, its long streams outlasted their TTL and were only extended.
func TestKillReconciledByPeer(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("crash", 20, nil)
	a := w.startGateway("gw-a")
	b := w.startGateway("gw-b")

	// Two one-call streams that will still be streaming when A dies: no tally, a lease.
	long := map[string]string{}
	s1 := startStream(t, a, key, 5000, 20*time.Millisecond, long)
	s2 := startStream(t, a, key, 5000, 20*time.Millisecond, long)
	// A call that completes and settles normally on A.
	control, _ := completeCall(t, a, key, chatBody(false, 50, "hello"), map[string]string{"X-Fake-Chunks": "20"})

	// The streams outlive their hold TTL: whichever process scans sees a live lease and only
	// pushes expires_at out. Wait until that has visibly happened to both.
	for _, s := range []*stream{s1, s2} {
		waitFor(t, 30*time.Second, "a leased stream's hold to be extended past its TTL", func() bool {
			r := w.hold(s.runID)
			if r.State != holds.StateRunning {
				t.Fatalf("live stream %s settled by the reconciler: %s", s.runID, r.SettleSource.String)
			}
			return r.ExpiresAt.Sub(r.CreatedAt) > testHoldTTL+testReconcile/2
		})
	}

	// Agent run R1: two completed calls, tallied; nothing in flight at the kill, so no lease.
	var r1Cost int64
	var r1Usage pricing.Usage
	var r1ID string
	for i, n := range []int{30, 70} {
		id, use := completeCall(t, a, key, chatBody(false, n+5, fmt.Sprintf("agent step %d", i)),
			map[string]string{"X-Run-Id": "agent-done", "X-Fake-Chunks": fmt.Sprint(n)})
		r1ID, r1Usage, r1Cost = id, r1Usage.Add(use), r1Cost+w.price.Cost(use)
	}
	// Agent run R2: one completed call, then one in the middle of its stream at the kill.
	r2ID, r2Usage := completeCall(t, a, key, chatBody(false, 45, "agent-mid step 0"),
		map[string]string{"X-Run-Id": "agent-mid", "X-Fake-Chunks": "40"})
	m := startStream(t, a, key, 5000, 20*time.Millisecond, map[string]string{"X-Run-Id": "agent-mid"})
	if m.runID != r2ID {
		t.Fatalf("second call of agent-mid ran as %s, want %s", m.runID, r2ID)
	}
	// The tally is written after the response; wait until both runs' calls are in it.
	for id, calls := range map[string]int64{r1ID: 2, r2ID: 1} {
		waitFor(t, 10*time.Second, "tally of "+id, func() bool {
			tl, found, err := w.tally.Get(context.Background(), id)
			return err == nil && found && tl.Calls == calls
		})
	}
	// A queued hold whose process dies before its first call: admitted, never forwarded.
	q, err := w.store.Admit(context.Background(), holds.AdmitRequest{RunID: "r_queued_orphan", UserID: u.ID,
		Model: "fake-gpt", State: holds.StateQueued, TTL: testHoldTTL})
	if err != nil {
		t.Fatal(err)
	}

	killAt := w.dbNow()
	a.signal(t, syscall.SIGKILL)
	t.Logf("SIGKILL gw-a at %s (database time)", killAt.Format(time.RFC3339Nano))

	waitFor(t, 60*time.Second, "every hold to be settled after the kill", func() bool { return w.liveHolds() == 0 })
	for _, s := range []*stream{s1, s2, m} {
		<-s.done // the client saw its stream cut
	}

	// Each run, settled once, by the right rule.
	type want struct {
		source  string
		charged int64
		cost    int64
		usage   *pricing.Usage
		calls   int
	}
	wants := map[string]want{
		control:  {source: holds.SourceComplete, charged: -1, calls: 1},
		s1.runID: {source: holds.SourceReconcileHold, charged: w.hold(s1.runID).HeldMicro},
		s2.runID: {source: holds.SourceReconcileHold, charged: w.hold(s2.runID).HeldMicro},
		r1ID:     {source: holds.SourceReconcile, charged: r1Cost, cost: r1Cost, usage: &r1Usage, calls: 2},
		r2ID:     {source: holds.SourceReconcile, charged: w.price.Cost(r2Usage), cost: w.price.Cost(r2Usage), usage: &r2Usage, calls: 1},
		q.RunID:  {source: holds.SourceRelease, charged: 0},
	}
	var total int64
	var last time.Duration
	for id, wt := range wants {
		r := w.hold(id)
		total += r.ChargedMicro
		if r.State != holds.StateSettled || r.SettleSource.String != wt.source {
			t.Errorf("run %s: state %s source %q, want settled by %s", id, r.State, r.SettleSource.String, wt.source)
			continue
		}
		if wt.charged >= 0 && r.ChargedMicro != wt.charged {
			t.Errorf("run %s (%s): charged %d, want %d", id, wt.source, r.ChargedMicro, wt.charged)
		}
		if wt.usage != nil && (r.InTok != wt.usage.Input || r.OutTok != wt.usage.Output || r.CostMicro != wt.cost || r.Calls != wt.calls) {
			t.Errorf("run %s: usage in %d out %d cost %d calls %d, want the tally: in %d out %d cost %d calls %d",
				id, r.InTok, r.OutTok, r.CostMicro, r.Calls, wt.usage.Input, wt.usage.Output, wt.cost, wt.calls)
		}
		if id == control {
			continue
		}
		after := r.SettledAt.Time.Sub(killAt)
		last = max(last, after)
		t.Logf("run %-42s %-15s charged %7d µUSD, settled %v after the kill (expires_at was %v after it)",
			id, r.SettleSource.String, r.ChargedMicro, after.Round(time.Millisecond), r.ExpiresAt.Sub(killAt).Round(time.Millisecond))
	}
	t.Logf("MEASURED: SIGKILL to last run settled: %v (hold/run TTL %v, lease TTL %v, reconcile every %v, lock TTL %v)",
		last.Round(time.Millisecond), testHoldTTL, testLeaseTTL, testReconcile, testLockTTL)
	if got := w.usedToday(u.ID); got != total {
		t.Errorf("day ledger %d, want the sum of settled charges %d", got, total)
	}

	// B did the reconciling, and counted the runs charged at their hold.
	metrics := scrape(t, b)
	if !strings.Contains(metrics, "tollgate_reconcile_hold_total 2") {
		t.Errorf("gw-b reconcile_hold counter: want 2; metrics:\n%s", grepLines(metrics, "tollgate_reconcile"))
	}
	t.Logf("gw-b reconcile metrics:\n%s", grepLines(metrics, "tollgate_reconcile"))

	// A settled run stays settled: a late call naming it is refused.
	resp := post(t, context.Background(), b, key, chatBody(false, 10, "late"), map[string]string{"X-Run-Id": "agent-done"})
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("call on a reconciled run: %d, want 409", resp.StatusCode)
	}
}

func scrape(t *testing.T, g *gateway) string {
	t.Helper()
	resp, err := http.Get(g.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
