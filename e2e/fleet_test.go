package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// The tests here run a fleet — two or three `gateway serve` processes on one MariaDB and one
// Redis — and send one caller's work to all of them at once: what keeps a user's limits, a
// key's single run and a named run's single charge must hold across processes, not within one.

// gatedFleet is a world behind a gated upstream (every request carrying X-Fake-Gate waits at
// the gate) with n gateways.
func gatedFleet(t *testing.T, n int, over map[string]string) (*world, *gatedUpstream, []*gateway) {
	t.Helper()
	w := newWorld(t)
	up := newGatedUpstream(t)
	w.upstream = up.srv
	if over != nil {
		w.config = w.writeConfig(over)
	}
	var gws []*gateway
	for i := range n {
		gws = append(gws, w.startGateway(fmt.Sprintf("gw-%c", 'a'+i)))
	}
	return w, up, gws
}

// TestFleetStormKeepsEachUsersLimits: three users' storms, each split over three gateways, every
// admitted call held at the upstream's gate. The first user may have 3 calls in flight: no more
// than 3 of its calls reach the upstream, whichever processes admitted them. The second may run
// 50 at once but has 50 credits: what its admitted calls hold together never passes them. The
// third, an agent with max_in_flight 2, sends its calls under six named runs: no more than two
// runs are admitted, each with no more than two calls at the upstream. Then the gate opens,
// every call ends, and each call was charged once.
func TestFleetStormKeepsEachUsersLimits(t *testing.T) {
	w, up, gws := gatedFleet(t, 3, map[string]string{"holds.hold_ttl": "10m"})
	rich, richKey := w.user("storm-rich", 3, nil)
	poorAllowance := int64(50_000)
	poor, poorKey := w.user("storm-poor", 50, &poorAllowance)

	// The third user's calls belong to six named runs, two calls each: a run is one slot of
	// max_in_flight 2, and runs at most 2 calls at once.
	agent, agentKey := w.user("storm-agent", 2, nil)

	const perUser = 24
	var calls []<-chan downCall
	named := map[int]bool{} // index in calls -> the call is one of the agent's named runs
	for i := range perUser {
		for _, k := range []string{richKey, poorKey} {
			g := gws[i%len(gws)]
			calls = append(calls, sendSeen(g, k, i%2 == 0, fmt.Sprintf("storm %s %d", k[:8], i), map[string]string{
				"X-Fake-Gate": "storm", "X-Fake-Chunks": "30"}))
		}
		if i < 12 {
			named[len(calls)] = true
			calls = append(calls, sendSeen(gws[(i+1)%len(gws)], agentKey, i%2 == 1, fmt.Sprintf("agent step %d", i), map[string]string{
				"X-Fake-Gate": "agent", "X-Fake-Chunks": "30", "X-Run-Id": fmt.Sprintf("storm-run-%d", i%6)}))
		}
	}
	// Every call is either refused (it answers now) or at the gate (it arrived): wait until the
	// two add up, then look at what is held.
	var (
		arrived, agentArrived int
		ended                 []downCall
	)
	deadline := time.After(60 * time.Second)
	for arrived+agentArrived+len(ended) < len(calls) {
		select {
		case gate := <-up.arrived:
			if gate == "agent" {
				agentArrived++
			} else {
				arrived++
			}
		case <-deadline:
			t.Fatalf("storm: %d arrived and %d answered of %d within 60s", arrived, len(ended), len(calls))
		default:
			got := false
			for i, ch := range calls {
				if ch == nil {
					continue
				}
				select {
				case c := <-ch:
					ended = append(ended, c)
					calls[i] = nil
					got = true
				default:
				}
			}
			if !got {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	live := func(userID uint64) (n int, held int64) {
		if err := w.db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(held_micro), 0) FROM run_holds
			WHERE user_id = ? AND state IN ('queued', 'running')`, userID).Scan(&n, &held); err != nil {
			t.Fatal(err)
		}
		return n, held
	}
	richLive, _ := live(rich.ID)
	poorLive, poorHeld := live(poor.ID)
	t.Logf("at the gate: %d calls; refused %d; rich live %d, poor live %d holding %d µUSD", arrived, len(ended), richLive, poorLive, poorHeld)
	if richLive > 3 {
		t.Errorf("user with max_in_flight 3 has %d calls live over three gateways", richLive)
	}
	if poorHeld > poorAllowance {
		t.Errorf("user with %d µUSD has %d µUSD held over three gateways", poorAllowance, poorHeld)
	}
	if arrived != richLive+poorLive {
		t.Errorf("%d calls reached the upstream, %d holds live", arrived, richLive+poorLive)
	}
	agentLive, _ := live(agent.ID)
	t.Logf("agent: %d runs live, %d calls at the gate", agentLive, agentArrived)
	if agentLive > 2 || agentArrived > 2*agentLive {
		t.Errorf("agent with max_in_flight 2: %d runs live, %d of their calls at the upstream; want at most 2 runs of 2 calls", agentLive, agentArrived)
	}
	refusedFor402 := 0
	for _, c := range ended {
		if c.status != http.StatusTooManyRequests && c.status != http.StatusPaymentRequired {
			t.Errorf("refused call: %d %q (err %v), want 429 or 402", c.status, c.code, c.err)
		}
		if c.status == http.StatusPaymentRequired {
			refusedFor402++
		}
	}
	// Each limit was reached, not merely kept: every call waits at the gate until it opens, so
	// the first user holds its 3 slots, the agent its 2 runs, and the second user is admitted
	// until its credits run out (a storm refused whole, or held at a lower limit, kept them all).
	if richLive != 3 || agentLive != 2 || poorLive == 0 || refusedFor402 == 0 {
		t.Errorf("limits not reached: %d of 3 slots held, %d of 2 agent runs live, %d calls of the user with %d µUSD live and %d refused 402",
			richLive, agentLive, poorLive, poorAllowance, refusedFor402)
	}
	up.open()
	var oneCall []downCall
	for i, ch := range calls {
		if ch == nil {
			continue
		}
		c := receive(t, ch, "gated call")
		if c.status != http.StatusOK || !c.complete {
			t.Errorf("admitted call: %d %q complete %v (err %v)", c.status, c.code, c.complete, c.err)
		} else if !named[i] {
			oneCall = append(oneCall, c)
		}
	}
	waitFor(t, 30*time.Second, "every hold settled", func() bool { return w.liveHolds() == 0 })
	// Each call of its own was charged once, its price, by its own settlement.
	for _, c := range oneCall {
		r := w.hold(c.runID)
		if want := min(w.price.Cost(c.usage), r.CapMicro); r.SettleSource.String != holds.SourceComplete || r.ChargedMicro != want ||
			r.InTok != c.usage.Input || r.OutTok != c.usage.Output {
			t.Errorf("call of run %s answered %d in / %d out: settled %s charged %d for %d / %d, want complete at %d",
				c.runID, c.usage.Input, c.usage.Output, r.SettleSource.String, r.ChargedMicro, r.InTok, r.OutTok, want)
		}
	}
	if bad, err := holds.Audit(context.Background(), w.db); err != nil || len(bad) > 0 {
		t.Errorf("audit: %v %+v", err, bad)
	}
}

// TestFleetIdempotencyKeyRacedOverTwoGateways: one request under one Idempotency-Key sent
// twenty times at once, half to each of two gateways. One attempt reaches the upstream; every
// other is answered 409 request_in_progress at once, on either process. Once it has ended, a
// retry on either gateway is its answer replayed byte for byte, and the user is charged once.
func TestFleetIdempotencyKeyRacedOverTwoGateways(t *testing.T) {
	w, up, gws := gatedFleet(t, 2, nil)
	u, key := w.user("idem-fleet", 50, nil)
	hdr := map[string]string{"Idempotency-Key": "fleet-key-1", "X-Fake-Gate": "idem", "X-Fake-Chunks": "25"}
	body := chatRequest(true, 40, "one request, many sends")

	const n = 20
	race := sendAtOnce(gws, n, key, body, hdr)
	up.awaitArrivals(t, 1)
	waitFor(t, 30*time.Second, "every send but the one at the gate answered", func() bool { return len(race.answered()) == n-1 })
	for _, a := range race.answered() {
		if a.status != http.StatusConflict || errorCodeOf(a.body) != "request_in_progress" {
			t.Errorf("a send while the first runs: %d %s (err %v), want 409 request_in_progress", a.status, a.body, a.err)
		}
	}
	up.open()
	var first reply
	for _, a := range race.wait() {
		if a.status == http.StatusOK {
			first = a
		}
	}
	if first.status != http.StatusOK {
		t.Fatalf("no send was answered 200")
	}
	select {
	case name := <-up.arrived:
		t.Fatalf("a second attempt (%s) reached the upstream", name)
	default:
	}
	checkReplayedOnEach(t, gws, key, body, hdr, first.body)
	waitFor(t, 30*time.Second, "the attempt settled", func() bool { return w.liveHolds() == 0 })
	var rows int
	var charged int64
	if err := w.db.QueryRow("SELECT COUNT(*), COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ?", u.ID).Scan(&rows, &charged); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || charged <= 0 || w.ledgerUsed(u.ID) != charged {
		t.Errorf("%d holds charged %d, ledger %d: want one hold charged once", rows, charged, w.ledgerUsed(u.ID))
	}
}

// TestFleetNamedRunSettledOnOneGatewayWhileCallsRunOnBoth: an agent's named run driven through
// two gateways — its calls alternating between them and overlapping — while the agent's settle
// is sent to one of them in the middle of it. Every call the agent was answered 200 and whole is
// in the run's one charge, and nothing else is: a call either ran before the settle and is
// charged, or was refused (409 run_settled, or 409 run_busy's counterpart for a call: none
// starts once settling began) and is not. Several rounds, so the settle lands at different
// points of the calls. The chains of calls wait for the settle at a point of each round's own:
// sent back to back, some call of them was always in flight, the settle was run_busy until the
// last had ended, and no round ever saw a call refused (every round charged every call).
func TestFleetNamedRunSettledOnOneGatewayWhileCallsRunOnBoth(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("fleet-run", 20, nil)
	cfg := w.longRuns()
	a := w.startGatewayWith("gw-a", cfg)
	b := w.startGatewayWith("gw-b", cfg)
	gws := []*gateway{a, b}
	var total int64
	for round := range 6 {
		name := fmt.Sprintf("fleet-run-%d", round)
		run := map[string]string{"X-Run-Id": name}
		// Even rounds open the run with a call of their own; odd ones open it with the first of
		// the overlapping calls, on either process.
		var (
			runID string
			use0  pricing.Usage
			calls int
		)
		if round%2 == 0 {
			runID, use0 = completeCall(t, gws[round%2], key, chatBody(false, 40, "first step"), with(run, "X-Fake-Chunks", "10"))
			calls = 1
		}
		// Each gateway gets a chain of calls, each sent as the one before it ends, the two
		// chains side by side: the settle below finds calls in flight, gaps between them, and
		// calls that start after it.
		const n = 12
		chans := make([]chan downCall, n)
		for i := range n {
			chans[i] = make(chan downCall, 1)
		}
		// The calls from pause on are sent once the settle has been answered: they must be
		// refused, those before it charged. The settle still meets the calls in flight before it.
		pause, settled := 2+2*round%(n-2), make(chan struct{})
		letGo := sync.OnceFunc(func() { close(settled) })
		defer letGo() // a round that fails before its settle leaves no chain waiting
		for side := range 2 {
			go func() {
				for i := side; i < n; i += 2 {
					if i >= pause {
						<-settled
					}
					chans[i] <- <-sendSeen(gws[i%2], key, i%4 < 2, fmt.Sprintf("round %d step %d", round, i), with(with(run,
						"X-Fake-Chunks", fmt.Sprint(5+i*3)), "X-Fake-Chunk-Interval", fmt.Sprintf("%dms", 1+round)))
				}
			}()
		}
		// The settle goes out once a call of the batch is under way (reserved, or ended), so it
		// lands among them rather than before them all.
		waitFor(t, 30*time.Second, "a call of the batch under way", func() bool {
			var id string
			var recorded int
			err := w.db.QueryRow("SELECT run_id, calls FROM run_holds WHERE user_id = ? AND client_run_id = ?", u.ID, name).Scan(&id, &recorded)
			if err != nil {
				return false
			}
			return len(w.reservations(id)) > 0 || recorded > calls
		})
		view := settleRunWhenFree(t, gws[(round+1)%2], key, name)
		letGo()
		want := use0
		for i, ch := range chans {
			c := receive(t, ch, fmt.Sprintf("round %d call %d", round, i))
			switch {
			case c.status == http.StatusOK && c.complete:
				want, calls = want.Add(c.usage), calls+1
				if runID == "" {
					runID = c.runID
				}
				if i >= pause {
					t.Errorf("round %d call %d, sent after the settle was answered: 200, want 409 run_settled", round, i)
				}
			case c.status == http.StatusConflict && (c.code == "run_settled" || c.code == "run_busy" || c.code == "run_settling"):
			default:
				t.Errorf("round %d call %d: %d %q complete %v (err %v)", round, i, c.status, c.code, c.complete, c.err)
			}
		}
		r := w.hold(runID)
		cost := w.price.Cost(want)
		t.Logf("round %d: %d calls charged of %d sent", round, calls, n+1-round%2)
		if view["state"] != "settled" || r.State != holds.StateSettled || r.Calls != calls || r.InTok != want.Input ||
			r.OutTok != want.Output || r.CostMicro != cost || r.ChargedMicro != cost {
			t.Errorf("round %d: run %s calls %d in %d out %d cost %d charged %d; the agent saw %d calls in %d out %d cost %d",
				round, r.State, r.Calls, r.InTok, r.OutTok, r.CostMicro, r.ChargedMicro, calls, want.Input, want.Output, cost)
		}
		total += r.ChargedMicro
	}
	if got := w.ledgerUsed(u.ID); got != total {
		t.Errorf("day ledger %d, want the runs' charges %d", got, total)
	}
}

// TestFleetIdempotencyKeyRetriedOverTwoGatewaysAfterAFailedAttempt: the first attempt of a key
// fails at the upstream (a 500: charged nothing, the key not pinned), and its SDK's retries —
// ten at once, half to each of two gateways — move the key on to its next attempt together. One
// retry runs it; every other is 409 request_in_progress, not a third attempt of its own; the
// answer is then replayed on both gateways, and the user is charged for one call.
func TestFleetIdempotencyKeyRetriedOverTwoGatewaysAfterAFailedAttempt(t *testing.T) {
	w, up, gws := gatedFleet(t, 2, nil)
	u, key := w.user("idem-fleet-retry", 50, nil)
	idem := map[string]string{"Idempotency-Key": "fleet-key-2"}
	body := chatRequest(false, 40, "retried after a failure")
	if r := <-sendAsync(context.Background(), gws[0], key, body, with(idem, "X-Fake-Status", "500")); r.status != http.StatusInternalServerError &&
		r.status != http.StatusBadGateway {
		t.Fatalf("first attempt: %d %s, want the upstream's failure", r.status, r.body)
	}
	waitFor(t, 30*time.Second, "the failed attempt settled", func() bool { return w.liveHolds() == 0 })

	const n = 10
	race := sendAtOnce(gws, n, key, body, with(with(idem, "X-Fake-Gate", "retry"), "X-Fake-Chunks", "20"))
	up.awaitArrivals(t, 1)
	waitFor(t, 30*time.Second, "every retry but the one at the gate answered", func() bool { return len(race.answered()) == n-1 })
	up.open()
	var ran reply
	for _, a := range race.wait() {
		switch {
		case a.status == http.StatusOK && ran.status == 0:
			ran = a
		case a.status == http.StatusConflict && errorCodeOf(a.body) == "request_in_progress":
		default:
			t.Errorf("a retry: %d %s (err %v), want one 200 and the rest 409 request_in_progress", a.status, a.body, a.err)
		}
	}
	select {
	case name := <-up.arrived:
		t.Fatalf("a second retry (%s) reached the upstream", name)
	default:
	}
	checkReplayedOnEach(t, gws, key, body, idem, ran.body)
	waitFor(t, 30*time.Second, "the attempt settled", func() bool { return w.liveHolds() == 0 })
	var rows, charged int
	var total int64
	if err := w.db.QueryRow("SELECT COUNT(*), COALESCE(SUM(charged_micro > 0), 0), COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ?",
		u.ID).Scan(&rows, &charged, &total); err != nil {
		t.Fatal(err)
	}
	if rows != 2 || charged != 1 || w.ledgerUsed(u.ID) != total {
		t.Errorf("%d attempts, %d charged (%d µUSD), ledger %d: want the failed one at 0 and one charged once", rows, charged, total, w.ledgerUsed(u.ID))
	}
}

// TestFleetLockMovesToTheSurvivorWhileHoldsOfBothExpire: two gateways each serve a stream that
// outlives its hold's TTL; gw-a (the one of them that holds the reconcile lock) an
// Idempotency-Key attempt too, whose retry sent to gw-b (the other) meanwhile is 409
// request_in_progress. gw-a is SIGKILLed while it holds the reconcile lock. gw-b's reconciler
// takes the lock once it lapses and settles gw-a's calls (no tally: at their hold), never its
// own stream, whose lease it finds, however often that stream's hold expires; its stream ends
// complete and is charged what it used. The key's retry on gw-b then runs as a new attempt,
// and is replayed after.
func TestFleetLockMovesToTheSurvivorWhileHoldsOfBothExpire(t *testing.T) {
	w := newWorld(t)
	_, key := w.user("lock-move", 10, nil)
	a, b := reconcileLockHolder(t, w, w.startGateway("gw-1"), w.startGateway("gw-2"))
	t.Logf("%s holds the reconcile lock: it serves the calls that die; %s survives", a.name, b.name)
	idem := map[string]string{"Idempotency-Key": "lock-move-1"}
	deadPlain := startStream(t, a, key, 5000, 20*time.Millisecond, nil)
	deadKeyed := startStream(t, a, key, 5000, 20*time.Millisecond, idem)
	live := startStream(t, b, key, 400, 20*time.Millisecond, nil) // 8 s: several hold TTLs
	for _, s := range []*stream{deadPlain, deadKeyed, live} {
		waitFor(t, 30*time.Second, "a leased stream's hold extended past its TTL", func() bool {
			r := w.hold(s.runID)
			if r.State != holds.StateRunning {
				t.Fatalf("live stream %s settled by the reconciler: %s", s.runID, r.SettleSource.String)
			}
			return r.ExpiresAt.Sub(r.CreatedAt) > testHoldTTL+testReconcile/2
		})
	}
	retry := func() reply {
		return <-sendAsync(context.Background(), b, key, chatBody(true, 5010, "stream please"), with(idem, "X-Fake-Chunks", "20"))
	}
	if r := retry(); r.status != http.StatusConflict || errorCodeOf(r.body) != "request_in_progress" {
		t.Fatalf("retry on %s while %s's attempt streams: %d %s", b.name, a.name, r.status, r.body)
	}
	lock := w.keys.ReconcileLock()
	waitFor(t, 30*time.Second, a.name+" to hold the reconcile lock", func() bool {
		v, _ := w.rdb.Get(context.Background(), lock).Result()
		return v == a.name
	})
	a.signal(t, syscall.SIGKILL)
	<-deadPlain.done
	<-deadKeyed.done
	for _, s := range []*stream{deadPlain, deadKeyed} {
		waitFor(t, 30*time.Second, a.name+"'s call settled by "+b.name, func() bool {
			if r := w.hold(live.runID); r.State != holds.StateRunning {
				select {
				case <-live.done:
				default:
					t.Fatalf("%s's live stream settled under it: %s", b.name, r.SettleSource.String)
				}
			}
			return w.hold(s.runID).State == holds.StateSettled
		})
		if r := w.hold(s.runID); r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != r.HeldMicro {
			t.Errorf("%s's call %s: %q charged %d, want reconcile_hold at %d", a.name, s.runID, r.SettleSource.String, r.ChargedMicro, r.HeldMicro)
		}
	}
	<-live.done
	if live.err != nil || live.last != "data: [DONE]" {
		t.Fatalf("%s's stream: %v, last %q", b.name, live.err, live.last)
	}
	waitFor(t, 30*time.Second, b.name+"'s stream settled", func() bool { return w.hold(live.runID).State == holds.StateSettled })
	if r := w.hold(live.runID); r.SettleSource.String != holds.SourceComplete || r.OutTok != 400 || r.ChargedMicro != r.CostMicro {
		t.Errorf("%s's stream: %q out %d charged %d cost %d, want complete with its 400 tokens", b.name, r.SettleSource.String,
			r.OutTok, r.ChargedMicro, r.CostMicro)
	}
	ran := retry()
	if ran.status != http.StatusOK || ran.runID == deadKeyed.runID {
		t.Fatalf("retry after %s's attempt was settled: %d run %s, want 200 as a new attempt", a.name, ran.status, ran.runID)
	}
	replayed := retry()
	if replayed.status != http.StatusOK || string(replayed.body) != string(ran.body) {
		t.Errorf("retry after the new attempt's answer: %d, body equal %v", replayed.status, string(replayed.body) == string(ran.body))
	}
}

// reconcileLockHolder returns the one of g1 and g2 that keeps the reconcile lock, then the
// other. Which one keeps it is settled by when each started, not by the test: its holder asks
// again every reconcile_interval, a moment after its lock (reconcile_lock_ttl, shorter) has
// lapsed, and the other takes it only if its own asks, as far apart, fall in that moment —
// and from then on keeps it the same way. A test that waited for the first to start to hold
// it waited out its deadline when the second had taken it at its start. The holder is the
// one seen holding it for a whole interval and lock TTL: every process has asked since.
func reconcileLockHolder(t *testing.T, w *world, g1, g2 *gateway) (holder, other *gateway) {
	t.Helper()
	lock := w.keys.ReconcileLock()
	var held string
	var since time.Time
	waitFor(t, 30*time.Second, "one gateway to keep the reconcile lock", func() bool {
		v, _ := w.rdb.Get(context.Background(), lock).Result()
		switch {
		case v == "":
			return false // lapsed, before its holder's next ask
		case v != held:
			held, since = v, time.Now()
			return false
		}
		return time.Since(since) > testReconcile+testLockTTL
	})
	switch held {
	case g1.name:
		return g1, g2
	case g2.name:
		return g2, g1
	}
	t.Fatalf("the reconcile lock is held by %q, neither %s nor %s", held, g1.name, g2.name)
	return nil, nil
}

// checkReplayedOnEach sends the key's request again to each gateway once its answer is
// recorded: each must replay that answer byte for byte.
func checkReplayedOnEach(t *testing.T, gws []*gateway, key string, body []byte, hdr map[string]string, answer []byte) {
	t.Helper()
	for _, g := range gws {
		resp := post(t, context.Background(), g, key, body, hdr)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "true" || string(raw) != string(answer) {
			t.Errorf("retry on %s after the answer: %d replayed %q, body equal %v", g.name, resp.StatusCode,
				resp.Header.Get("Idempotent-Replayed"), string(raw) == string(answer))
		}
	}
}

// sendRace is n copies of one request sent at once, alternating over the gateways, and the
// answers come so far.
type sendRace struct {
	mu      sync.Mutex
	answers []reply
	wg      sync.WaitGroup
}

// sendAtOnce starts n sends of one request, released together, the i-th to gws[i%len(gws)].
func sendAtOnce(gws []*gateway, n int, key string, body []byte, hdr map[string]string) *sendRace {
	r := &sendRace{}
	start := make(chan struct{})
	for i := range n {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			<-start
			a := <-sendAsync(context.Background(), gws[i%len(gws)], key, body, hdr)
			r.mu.Lock()
			r.answers = append(r.answers, a)
			r.mu.Unlock()
		}()
	}
	close(start)
	return r
}

// answered is a copy of the answers come so far.
func (r *sendRace) answered() []reply {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]reply(nil), r.answers...)
}

// wait waits for every send's answer and returns them.
func (r *sendRace) wait() []reply {
	r.wg.Wait()
	return r.answered()
}
