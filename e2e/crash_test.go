package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
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
	// A's reconciler asks for the lock at its start and then not for an hour: B does every
	// pass. Run agent-done is idle from its last call on, its expiry run_ttl (3 s) after it; a
	// loaded machine that took longer than that to reach the kill let A, when it held the lock,
	// settle the run itself, and B's counters missed it.
	a := w.startGatewayWith("gw-a", w.writeConfig(map[string]string{"holds.reconcile_interval": "1h"}))
	b := w.startGateway("gw-b")

	// Two one-call streams that will still be streaming when A dies: no tally, a lease.
	long := map[string]string{}
	s1 := startStream(t, a, key, 5000, 20*time.Millisecond, long)
	s2 := startStream(t, a, key, 5000, 20*time.Millisecond, long)
	// A call that completes and settles normally on A.
	control, controlUse := completeCall(t, a, key, chatBody(false, 50, "hello"), map[string]string{"X-Fake-Chunks": "20"})

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
		control:  {source: holds.SourceComplete, charged: w.price.Cost(controlUse), cost: w.price.Cost(controlUse), usage: &controlUse, calls: 1},
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
		if r.ChargedMicro != wt.charged {
			t.Errorf("run %s (%s): charged %d, want %d", id, wt.source, r.ChargedMicro, wt.charged)
		}
		if wt.usage != nil && (r.InTok != wt.usage.Input || r.OutTok != wt.usage.Output || r.CostMicro != wt.cost || r.Calls != wt.calls) {
			t.Errorf("run %s: usage in %d out %d cost %d calls %d, want (the caller's, or the tally) in %d out %d cost %d calls %d",
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
	if got := w.ledgerUsed(u.ID); got != total {
		t.Errorf("day ledger %d, want the sum of settled charges %d", got, total)
	}

	// B did the reconciling, and counted the runs charged at their hold.
	metrics := scrape(t, b)
	if !strings.Contains(metrics, "tollgate_reconcile_hold_total 2") {
		t.Errorf("gw-b reconcile_hold counter: want 2; metrics:\n%s", grepLines(metrics, "tollgate_reconcile"))
	}
	t.Logf("gw-b reconcile metrics:\n%s", grepLines(metrics, "tollgate_reconcile"))
	// And what its reconciler charged, by rule, as the rows say.
	for source, runs := range map[string][]string{holds.SourceReconcileHold: {s1.runID, s2.runID}, holds.SourceReconcile: {r1ID, r2ID}} {
		var sum int64
		for _, id := range runs {
			sum += w.hold(id).ChargedMicro
		}
		series := fmt.Sprintf("tollgate_charged_micro_usd_total{source=%q}", source)
		if got := metricValue(metrics, series); got != float64(sum) {
			t.Errorf("gw-b %s = %v, want the rows' %d; metrics:\n%s", series, got, sum, grepLines(metrics, "tollgate_charged"))
		}
	}

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

// metricValue is the value of one series in a scrape, -1 when it is absent or unreadable.
func metricValue(scrape, series string) float64 {
	for l := range strings.SplitSeq(scrape, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
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

// TestKillAfterTallyBeforeSettle: the window of DESIGN §3 steps 7–8. A call has answered and
// tallied, and its settlement waits on the user's lock, when the process is SIGKILLed. The
// dead process's settlement transaction never commits; the reconciler must charge the call
// what its tally says it used — once, not its hold, and not nothing. One call's answer carried
// no usage report, so it was charged an estimate: its settled row must say estimated, as the
// dead process's settlement would have (a billing team reads the mark to tell the gateway's
// count from the provider's).
func TestKillAfterTallyBeforeSettle(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("kill-tallied", 10, nil)
	a := w.startGateway("gw-a")
	// The three calls stay mid-stream (after their first event) until the user's row is
	// locked: streaming on their own, a loaded machine could see the first call end, and
	// settle, before the lock was taken.
	held, letGo := w.holdStreams("tallied", nil)
	var calls []*stream
	for range 2 {
		calls = append(calls, startStream(t, a, key, 20, 20*time.Millisecond, held))
	}
	estimated := startStream(t, a, key, 20, 20*time.Millisecond, with(held, "X-Fake-Usage", "off"))
	calls = append(calls, estimated)
	release := w.lockUser(u.ID)
	letGo()
	tallies := map[string]int64{}
	for _, s := range calls {
		<-s.done
		waitFor(t, 10*time.Second, "the tally of "+s.runID, func() bool {
			tl, found, err := w.tally.Get(context.Background(), s.runID)
			tallies[s.runID] = tl.CostMicro
			return err == nil && found && tl.Calls == 1
		})
	}
	// What the reconciler is to charge: each answered call's 20 output tokens at their price
	// (the one without a usage report, the gateway's estimate).
	for _, s := range calls {
		if s != estimated {
			w.tallyAtPrice(t, s.runID, 20)
		}
	}
	a.signal(t, syscall.SIGKILL)
	release()
	if n := w.liveHolds(); n != len(calls) {
		t.Fatalf("%d live holds after the kill, want %d (no settlement committed)", n, len(calls))
	}
	w.reconcileAtTally(t, u.ID, tallies)
	for _, s := range calls {
		if r := w.hold(s.runID); r.Estimated != (s == estimated) {
			t.Errorf("call %s reconciled with estimated=%v, want %v", s.runID, r.Estimated, s == estimated)
		}
	}
}

// TestKillMidRunCallThenContinue: a named run's call is SIGKILLed mid-stream; the agent comes
// back through another process and goes on with the same run, then settles it. The dead call
// reserved part of the run's budget and never gave it back (no process is left to): the run's
// next call and its settlement must not be refused because of it once the dead process's
// lease has lapsed. The run is then charged once, at what its two answered calls cost as the
// upstream reported them (the killed call left no usage: README Known limits) — not its hold,
// not a call twice, and not the answered calls' cost lost with the dead one.
func TestKillMidRunCallThenContinue(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("kill-run", 10, nil)
	// Runs that outlive the test: only the agent settles this one.
	cfg := w.writeConfig(map[string]string{"holds.run_ttl": "10m", "holds.hold_ttl": "10m"})
	a := w.startGatewayWith("gw-a", cfg)
	run := map[string]string{"X-Run-Id": "agent-crash"}
	runID, use0 := completeCall(t, a, key, chatBody(false, 40, "step 0"), with(run, "X-Fake-Chunks", "30"))
	// A call that bounds its output by nothing: it reserves all the run has left.
	unbounded, _ := json.Marshal(map[string]any{"model": "fake-gpt", "stream": true,
		"messages": []map[string]string{{"role": "user", "content": "step 1"}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, a, key, unbounded, with(with(run, "X-Fake-Chunks", "10000"), "X-Fake-Chunk-Interval", "20ms"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("step 1: %d", resp.StatusCode)
	}
	buf := make([]byte, 256)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatalf("step 1: no first bytes: %v", err)
	}
	// Mid-stream, leased (the heartbeat has written the lease) and holding its reservation: the
	// kill must leave one behind, or the run's next call has nothing to be refused by.
	waitFor(t, 10*time.Second, "the call's lease", func() bool { return len(w.leaseKeys()) == 1 })
	if held := w.reservations(runID); len(held) != 1 {
		t.Fatalf("reservations of the run mid-call: %v, want the running call's one", held)
	}
	a.signal(t, syscall.SIGKILL)
	killed := time.Now()
	resp.Body.Close()

	b := w.startGatewayWith("gw-b", cfg)
	// Once the dead process's lease has lapsed nothing serves the run any more.
	waitFor(t, 3*testLeaseTTL, "the dead process's lease to lapse", func() bool { return len(w.leaseKeys()) == 0 })
	// Its reservation was beaten last before the kill, on a ticker of its own: stale for
	// certain one lease TTL after the kill.
	time.Sleep(time.Until(killed.Add(testLeaseTTL + 100*time.Millisecond)))
	r2 := post(t, context.Background(), b, key, chatBody(false, 40, "step 2"), with(run, "X-Fake-Chunks", "30"))
	raw, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != http.StatusOK {
		t.Fatalf("the run's next call after the crash: %d %s; reservations %v", r2.StatusCode, raw, w.reservations(runID))
	}
	var out2 struct {
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out2); err != nil || out2.Usage.Completion != 30 || use0.Output != 30 {
		t.Fatalf("the run's answered calls: step 0 %d output tokens, step 2 %s (%v); want 30 each (X-Fake-Chunks)", use0.Output, raw, err)
	}
	use2 := pricing.Usage{Input: out2.Usage.Prompt, Output: out2.Usage.Completion}
	req, _ := http.NewRequest(http.MethodPost, b.url+"/v1/runs/agent-crash/settle", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	sr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(sr.Body)
	sr.Body.Close()
	if sr.StatusCode != http.StatusOK {
		t.Fatalf("settling the run after the crash: %d %s; reservations %v", sr.StatusCode, raw, w.reservations(runID))
	}
	// Charged once, what the upstream reported of the two answered calls: a settlement that
	// answered 200 at its hold, or with a call counted twice or lost, said nothing above.
	want := w.price.Cost(use0) + w.price.Cost(use2)
	r := w.hold(runID)
	if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceClient || r.Calls != 2 ||
		r.InTok != use0.Input+use2.Input || r.OutTok != use0.Output+use2.Output || r.ChargedMicro != min(want, r.CapMicro) {
		t.Errorf("run %s after the crash: %s by %q, %d calls, %d in / %d out, charged %d (held %d, cap %d); want settled by client, 2 calls, %d in / %d out, charged %d",
			runID, r.State, r.SettleSource.String, r.Calls, r.InTok, r.OutTok, r.ChargedMicro, r.HeldMicro, r.CapMicro,
			use0.Input+use2.Input, use0.Output+use2.Output, want)
	}
	if n := w.liveHolds(); n != 0 {
		t.Errorf("%d holds live after the run's settlement, want none", n)
	}
	if got := w.ledgerUsed(u.ID); got != r.ChargedMicro {
		t.Errorf("day ledger %d, want the run's charge %d", got, r.ChargedMicro)
	}
}

// TestKillAfterHoldBeforeForward: the process dies between committing a call's hold and
// forwarding it (here: while its duplicate check waits on a Redis that has stopped answering).
// The call never reached the upstream, but its hold was inserted as running (DESIGN §3: a call
// forwarded at once is not queued), it has no lease and no tally: DESIGN §5 rule 3 charges it
// what it held, as reconcile_hold. This pins that rule at this step.
func TestKillAfterHoldBeforeForward(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("kill-early", 10, nil)
	f := newFreezer(t, w.redisAddr())
	cfg := w.writeConfig(map[string]string{"dedup.window": "5s"})
	a := w.startGatewayWith("gw-a", cfg, "REDIS_URL=redis://"+f.addr()+"/0")
	f.freeze()
	ch := sendAsync(context.Background(), a, key, chatBody(false, 20, "never forwarded"), nil)
	var runID string
	waitFor(t, 10*time.Second, "the call's hold", func() bool {
		_ = w.db.Get(&runID, "SELECT COALESCE(MAX(run_id), '') FROM run_holds WHERE user_id = ?", u.ID)
		return runID != ""
	})
	a.signal(t, syscall.SIGKILL)
	<-ch
	// The moment the test names: the hold committed, the call not yet forwarded. Killed after
	// the forward, the call would be a mid-call kill, which other tests cover.
	if n := w.held.calls.Load(); n != 0 {
		t.Fatalf("the upstream got %d calls before the kill, want none: the kill landed after the forward", n)
	}
	f.thaw()
	w.startGateway("gw-b")
	waitFor(t, 30*time.Second, "the hold to be reconciled", func() bool { return w.liveHolds() == 0 })
	r := w.hold(runID)
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != r.HeldMicro {
		t.Errorf("call killed before forwarding: settled by %q charged %d, want reconcile_hold at its hold %d",
			r.SettleSource.String, r.ChargedMicro, r.HeldMicro)
	}
	t.Logf("call killed after its hold, before forwarding: %s, charged %d of %d held", r.SettleSource.String, r.ChargedMicro, r.HeldMicro)
}

// TestKillMidIdempotentCall: an Idempotency-Key call is SIGKILLed mid-stream and the SDK retries
// it on another process. What the retry gets while the dead attempt's hold is live, and after
// the reconciler has closed it, is logged; the money must come out once per attempt: the dead
// attempt at its hold (no tally), the retry at what it used.
func TestKillMidIdempotentCall(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("kill-idem", 10, nil)
	a := w.startGateway("gw-a")
	idem := map[string]string{"Idempotency-Key": "sdk-retry-1"}
	s := startStream(t, a, key, 5000, 20*time.Millisecond, idem)
	waitFor(t, 10*time.Second, "the call's lease", func() bool { return len(w.leaseKeys()) == 1 })
	a.signal(t, syscall.SIGKILL)
	<-s.done
	b := w.startGateway("gw-b")
	body := chatBody(true, 5010, "stream please")
	retry := func() reply {
		return <-sendAsync(context.Background(), b, key, body, with(idem, "X-Fake-Chunks", "20"))
	}
	first := retry()
	t.Logf("retry right after the kill: %d %.160s", first.status, first.body)
	waitFor(t, 30*time.Second, "the dead attempt to be reconciled", func() bool { return w.hold(s.runID).State == holds.StateSettled })
	second := retry()
	t.Logf("retry after the reconciler closed the dead attempt: %d run %s", second.status, second.runID)
	if second.status != http.StatusOK || second.runID == s.runID {
		t.Errorf("retry after reconciliation: %d run %s, want 200 as a new attempt", second.status, second.runID)
	}
	dead := w.hold(s.runID)
	if dead.SettleSource.String != holds.SourceReconcileHold || dead.ChargedMicro != dead.HeldMicro {
		t.Errorf("dead attempt: %q charged %d, want reconcile_hold at %d", dead.SettleSource.String, dead.ChargedMicro, dead.HeldMicro)
	}
	waitFor(t, 10*time.Second, "every hold settled", func() bool { return w.liveHolds() == 0 })
	// The retry at what it used: its 20 output tokens (X-Fake-Chunks) at their price, by its own
	// settlement. (The ledger below only matches the rows: a retry charged its hold, or a token
	// too many, kept it.)
	w.settledAtPrice(t, second.runID, holds.SourceComplete, 20)
	var total int64
	if err := w.db.Get(&total, "SELECT SUM(charged_micro) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if got := w.ledgerUsed(u.ID); got != total {
		t.Errorf("day ledger %d, want %d", got, total)
	}
}
