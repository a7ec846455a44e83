package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// cutDrain is the shutdown_timeout of the SIGTERM tests whose short streams (20 events 50 ms
// apart) must finish inside the drain while their long ones are cut at its deadline: with the
// suite's 2 s, the last short stream, started just before the signal, had 1 s to spare, which
// a loaded machine can use up (as it did for the signal tests' streams: unhurriedDrain). The
// long streams run for minutes either way; each test takes the drain's length.
const cutDrain = 6 * time.Second

// TestSigtermSettlesEverything: SIGTERM while streams are in flight. The gateway lets the
// short streams finish inside shutdown_timeout, cuts the long ones at the deadline, waits for
// every settlement and exits 0 — within the drain plus settle_timeout (10 s here) plus the 5 s
// it allows itself to stop. No other process runs a reconciler here: every run must have been
// settled by the process itself, none left live, no lease left.
func TestSigtermSettlesEverything(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term", 10, nil)
	g := w.startGatewayWith("gw-term", w.writeConfig(map[string]string{"limits.shutdown_timeout": cutDrain.String()}))

	// Short streams end well inside the drain; long ones would run for minutes.
	var short, long []*stream
	for range 3 {
		short = append(short, startStream(t, g, key, 20, 50*time.Millisecond, nil))
	}
	for range 3 {
		long = append(long, startStream(t, g, key, 10_000, 20*time.Millisecond, nil))
	}
	sentAt := time.Now()
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, cutDrain+15*time.Second); err != nil {
		t.Errorf("gateway exit after SIGTERM: %v, want status 0", err)
	}
	t.Logf("exited %v after SIGTERM (drain deadline %v)", time.Since(sentAt).Round(time.Millisecond), cutDrain)

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
		w.settledAtPrice(t, s.runID, holds.SourceComplete, 20)
	}
	for _, s := range long {
		<-s.done
		r := w.hold(s.runID)
		src := r.SettleSource.String
		if src != holds.SourceShutdown {
			t.Errorf("long stream %s: settled by %q, want cut at the deadline (shutdown)", s.runID, src)
		}
		// What was streamed before the cut is charged, not the hold and not nothing.
		w.cutAtItsText(t, s)
		t.Logf("long stream cut: %s, %d output tokens, charged %d µUSD (estimated %v), client read %d events",
			src, r.OutTok, r.ChargedMicro, r.Estimated, s.chunks)
		// Its caller is told why, in the stream, and the stream ends cleanly.
		if s.err != nil || !strings.Contains(s.last, `"code":"shutting_down"`) {
			t.Errorf("long stream %s: ended with %v after %q; want a shutting_down error event and a clean end", s.runID, s.err, s.last)
		}
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

// TestSigtermNamedRunCallsInFlight: SIGTERM while calls of a named run are in flight. Calls of
// a named run never settle on their own (DESIGN §4): the one that ends inside the drain and
// the one cut at the deadline must each leave their usage in the run's tally and on its row,
// give back their budget reservation and lease, and leave the run open. A later process's
// reconciler then charges the run exactly what its three calls tallied — not its hold, and
// not the completed call alone.
func TestSigtermNamedRunCallsInFlight(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term-run", 10, nil)
	g := w.startGatewayWith("gw-term-run", w.writeConfig(map[string]string{"limits.shutdown_timeout": cutDrain.String()}))
	run := map[string]string{"X-Run-Id": "agent-term"}

	runID, use0 := completeCall(t, g, key, chatBody(false, 40, "step 0"), with(run, "X-Fake-Chunks", "30"))
	short := startStream(t, g, key, 20, 50*time.Millisecond, run)
	long := startStream(t, g, key, 10_000, 20*time.Millisecond, run)
	// A plain call cut beside them settles itself as before.
	plain := startStream(t, g, key, 10_000, 20*time.Millisecond, nil)
	if short.runID != runID || long.runID != runID {
		t.Fatalf("calls of the run ran as %s and %s, want %s", short.runID, long.runID, runID)
	}
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, cutDrain+15*time.Second); err != nil {
		t.Errorf("gateway exit after SIGTERM: %v, want status 0", err)
	}
	for _, s := range []*stream{short, long, plain} {
		<-s.done
	}
	if short.chunks < 20 || short.err != nil {
		t.Errorf("the run's short call: client read %d events (err %v), want all 20", short.chunks, short.err)
	}

	ctx := context.Background()
	r := w.hold(runID)
	if r.State != holds.StateRunning {
		t.Fatalf("named run after SIGTERM: %s by %q, want it left open (running)", r.State, r.SettleSource.String)
	}
	tl, found, err := w.tally.Get(ctx, runID)
	if err != nil || !found {
		t.Fatalf("tally of the run after SIGTERM: found %v err %v", found, err)
	}
	if tl.Calls != 3 || tl.CostMicro <= w.price.Cost(use0) {
		t.Errorf("tally after SIGTERM: %d calls costing %d, want 3 calls costing more than the first alone (%d)",
			tl.Calls, tl.CostMicro, w.price.Cost(use0))
	}
	if rc, rcost, rcalls, _ := r.Recorded(); rcalls != tl.Calls || rcost != tl.CostMicro || rc != tl.Usage {
		t.Errorf("run row records %d calls costing %d (%+v), the tally %d costing %d (%+v): want the same",
			rcalls, rcost, rc, tl.Calls, tl.CostMicro, tl.Usage)
	}
	if res := w.reservations(runID); len(res) != 0 {
		t.Errorf("budget reservations left after a graceful shutdown: %v", res)
	}
	if l := w.leaseKeys(); len(l) != 0 {
		t.Errorf("leases left after a graceful shutdown: %v", l)
	}
	if p := w.hold(plain.runID); p.State != holds.StateSettled || p.SettleSource.String != holds.SourceShutdown {
		t.Errorf("plain call cut at the deadline: %s by %q, want settled by shutdown", p.State, p.SettleSource.String)
	}

	// Another process reconciles the run once it expires: from the tally, all three calls.
	w.startGateway("gw-after")
	waitFor(t, 30*time.Second, "the run to be reconciled", func() bool { return w.hold(runID).State == holds.StateSettled })
	r = w.hold(runID)
	if r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != tl.CostMicro || r.Calls != int(tl.Calls) {
		t.Errorf("run reconciled by %q: charged %d for %d calls, want by reconcile: %d for %d calls",
			r.SettleSource.String, r.ChargedMicro, r.Calls, tl.CostMicro, tl.Calls)
	}
	t.Logf("run %s: 3 calls (one cut at the deadline) charged %d µUSD (held %d); first call alone %d",
		runID, r.ChargedMicro, r.HeldMicro, w.price.Cost(use0))
	if got, want := w.ledgerUsed(u.ID), r.ChargedMicro+w.hold(plain.runID).ChargedMicro; got != want {
		t.Errorf("day ledger %d, want the two settled charges %d", got, want)
	}
}

// TestSigtermWaitsForQueuedSettlements: SIGTERM while the settlements of answered calls wait
// in the batch writer behind a user lock (a slow money transaction). The drain must wait for
// them: once the lock goes, within settle_timeout, every call is settled by the process itself,
// exactly once, at what it used.
func TestSigtermWaitsForQueuedSettlements(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term-queued", 10, nil)
	// The calls must end inside the drain (it ends when they do): with the suite's 2 s, the
	// 1 s of events left after SIGTERM had 1 s to spare, which a loaded machine can use up,
	// and a call cut at the deadline settles as "shutdown", not at what it used.
	g := w.startGatewayWith("gw-term-queued", w.writeConfig(map[string]string{"limits.shutdown_timeout": unhurriedDrain.String()}))
	// The calls stay mid-stream (after their first event) until the user's row is locked and
	// SIGTERM sent: started one after another, a loaded machine could otherwise see the first
	// end, and settle, before the lock.
	held, letGo := w.holdStreams("queued", nil)
	var calls []*stream
	for range 4 {
		calls = append(calls, startStream(t, g, key, 20, 50*time.Millisecond, held))
	}
	release := w.lockUser(u.ID) // the calls are admitted; their settlements will wait
	g.signal(t, syscall.SIGTERM)
	letGo()
	for _, s := range calls {
		<-s.done
		if s.chunks < 20 || s.err != nil {
			t.Errorf("call %s: client read %d events (err %v), want all 20", s.runID, s.chunks, s.err)
		}
	}
	// The answers are out and the drain of the calls is over (the process says so); their
	// settlements are stuck behind the lock. The process must still be waiting for them. (One
	// that did not wait exits at once; its settlements, still behind the lock, never land, which
	// the checks after the release catch too.)
	waitFor(t, 10*time.Second, "the drain of the calls to end", func() bool {
		b, err := os.ReadFile(g.log)
		return err == nil && strings.Contains(string(b), "calls drained; waiting for their settlements")
	})
	waitFor(t, 10*time.Second, "the settlements to wait on the user's row lock", func() bool {
		var n int
		err := w.db.Get(&n, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE '%FROM users WHERE id%FOR UPDATE%'`)
		return err == nil && n > 0
	})
	select {
	case <-g.done:
		t.Fatalf("gateway exited (%v) with its settlements still waiting on a lock", g.err)
	default:
	}
	if n := w.liveHolds(); n != len(calls) {
		t.Fatalf("%d live holds while the lock is held, want %d", n, len(calls))
	}
	release()
	if err := g.wait(t, 20*time.Second); err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
	var total int64
	for _, s := range calls {
		// At what it used (a charge above 0 alone let a settlement at the wrong usage through).
		w.settledAtPrice(t, s.runID, holds.SourceComplete, 20)
		total += w.hold(s.runID).ChargedMicro
	}
	if got := w.ledgerUsed(u.ID); got != total {
		t.Errorf("day ledger %d, want %d", got, total)
	}
}

// TestSigtermSettlementsOutlastingTheDrain: as above, but the lock outlives settle_timeout.
// The process must not wait for ever: it gives up at its deadline (the drain plus
// settle_timeout plus its 5 s) — it exits while the lock is still held, saying it left the
// settlements to the reconciler — leaves the holds live for the reconciler and drops their
// leases. Each call's tally is what it used, so another process's reconciler charges each call
// that — not its hold.
func TestSigtermSettlementsOutlastingTheDrain(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term-stuck", 10, nil)
	// The calls must end inside the drain, as above: a call cut at the deadline tallies an
	// estimate, not the 20 tokens the checks below read.
	g := w.startGatewayWith("gw-term-stuck", w.writeConfig(map[string]string{"limits.shutdown_timeout": unhurriedDrain.String()}))
	// Held mid-stream until the lock is taken and SIGTERM sent, as above.
	held, letGo := w.holdStreams("stuck", nil)
	var calls []*stream
	for range 3 {
		calls = append(calls, startStream(t, g, key, 20, 50*time.Millisecond, held))
	}
	release := w.lockUser(u.ID)
	g.signal(t, syscall.SIGTERM)
	letGo()
	const settleTimeout = 10 * time.Second // the world's limits.settle_timeout
	// The wait's own deadline catches a hang; it does not measure the exit.
	if err := g.wait(t, unhurriedDrain+settleTimeout+5*time.Second+30*time.Second); err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
	// Exited with the lock still held (release comes below): it did not wait for it.
	if l := gaveUp(t, g); len(l) == 0 {
		t.Errorf("the gateway exited with its settlements stuck without saying it gave them up: want one of %q", gaveUpLines)
	}
	if n := w.liveHolds(); n != len(calls) {
		t.Fatalf("%d live holds after the process gave up, want %d left for the reconciler", n, len(calls))
	}
	if l := w.leaseKeys(); len(l) != 0 {
		t.Errorf("leases left by a process that gave up its settlements: %v", l)
	}
	tallies := map[string]int64{}
	for _, s := range calls {
		tallies[s.runID] = w.tallyAtPrice(t, s.runID, 20)
	}
	release()
	w.reconcileAtTally(t, u.ID, tallies)
}

// TestSigtermStuckUpstream: SIGTERM while calls wait on an upstream that has stopped
// answering — one that never sends its headers, one that stalls mid-stream. The drain cannot
// wait for them: at its deadline they are cut, the process exits promptly — with nothing left to
// wait for, not at the end of its settle bound — and each is charged what it used (the
// prompt's estimate; plus the streamed part for the stalled stream), settled as "shutdown" by
// the process itself.
func TestSigtermStuckUpstream(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term-upstream", 10, nil)
	g := w.startGateway("gw-term-upstream")
	noHeaders := sendAsync(context.Background(), g, key, chatBody(false, 50, "never answered"),
		map[string]string{"X-Fake-Latency": "1h"})
	noHeadersStream := sendAsync(context.Background(), g, key, chatBody(true, 50, "never answered either"),
		map[string]string{"X-Fake-Latency": "1h"})
	stalled := startStream(t, g, key, 5, time.Hour, nil) // one event, then nothing
	waitFor(t, 10*time.Second, "three calls in flight", func() bool { return w.liveHolds() == 3 })
	waitFor(t, 10*time.Second, "the three calls sent upstream", func() bool {
		return strings.Contains(scrape(t, g), `tollgate_call_phase_seconds_count{phase="checks"} 3`)
	})

	g.signal(t, syscall.SIGTERM)
	// The wait's own deadline catches a hang; it does not measure the exit.
	if err := g.wait(t, testShutdownDrain+45*time.Second); err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
	// Cut at the drain's deadline, and nothing left waiting after: the cut calls ended and
	// settled, rather than holding the exit until its bound.
	if b, _ := os.ReadFile(g.log); !strings.Contains(string(b), "drain deadline passed; cutting remaining calls") {
		t.Errorf("no line saying the calls were cut at the drain's deadline")
	}
	if l := gaveUp(t, g); len(l) != 0 {
		t.Errorf("the gateway waited for the cut calls until its exit's bound: %q", l)
	}
	// Each caller is told why its call ended: 503 before any answer (a stream's too), an
	// error event in a stream under way.
	for _, ch := range []<-chan reply{noHeaders, noHeadersStream} {
		rp := <-ch
		if rp.err != nil || rp.status != http.StatusServiceUnavailable || !strings.Contains(string(rp.body), `"code":"shutting_down"`) {
			t.Errorf("silent call's client: status %d err %v body %.200s; want 503 shutting_down", rp.status, rp.err, rp.body)
		}
	}
	<-stalled.done
	if stalled.err != nil || !strings.Contains(stalled.last, `"code":"shutting_down"`) {
		t.Errorf("stalled stream: ended with %v after %q; want a shutting_down error event and a clean end", stalled.err, stalled.last)
	}
	if n := w.liveHolds(); n != 0 {
		t.Fatalf("%d holds left live", n)
	}
	var ids []string
	if err := w.db.Select(&ids, "SELECT run_id FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, id := range ids {
		r := w.hold(id)
		total += r.ChargedMicro
		if r.SettleSource.String != holds.SourceShutdown || r.ChargedMicro <= 0 || r.ChargedMicro >= r.HeldMicro {
			t.Errorf("run %s: settled by %q charged %d (held %d, out %d); want shutdown at its estimate",
				id, r.SettleSource.String, r.ChargedMicro, r.HeldMicro, r.OutTok)
		}
	}
	if got := w.ledgerUsed(u.ID); got != total {
		t.Errorf("day ledger %d, want %d", got, total)
	}
}

// TestSigtermFrozenDatabase: SIGTERM while MariaDB stops answering (the connection stays up;
// no reply comes). Two cases: frozen before the settlements reach it, and frozen just after a
// settlement's COMMIT went out. Either way the process must exit at a stated bound — the
// drain plus settle_timeout plus the 5 s serve allows itself — while MariaDB is still frozen,
// saying it gave up, and every hold must end up charged once, by the process or, failing that,
// by a reconciler from the tally.
func TestSigtermFrozenDatabase(t *testing.T) {
	const settleTimeout = 10 * time.Second // the world's limits.settle_timeout
	bound := testShutdownDrain + settleTimeout + 5*time.Second
	for _, tc := range []struct {
		name        string
		afterCommit bool
		calls       int
	}{
		{"before-settlement", false, 3},
		// More calls than the writer has workers (4): the settlements that find every worker
		// busy wait for one, and the writer's Close waits for them in turn.
		{"before-settlement-8-calls", false, 8},
		{"after-commit-sent", true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			u, key := w.user("term-frozen", 10, nil)
			f := newFreezer(t, w.mysqlAddr())
			g := w.startGatewayWith("gw-frozen", w.config, "MYSQL_DSN="+w.dsnVia(f))
			var calls []*stream
			for i := range tc.calls {
				// Ends 100 ms apart: each settlement reaches the writer on its own.
				calls = append(calls, startStream(t, g, key, 20+5*i, 20*time.Millisecond, nil))
			}
			var fired <-chan struct{}
			if tc.afterCommit {
				fired = f.freezeAfter("COMMIT")
			} else {
				f.freeze()
			}
			g.signal(t, syscall.SIGTERM)
			// The wait's own deadline catches a hang; it does not measure the exit.
			if err := g.wait(t, bound+60*time.Second); err != nil {
				t.Errorf("gateway exit: %v, want status 0", err)
			}
			if fired != nil {
				select {
				case <-fired:
				default:
					t.Fatal("no COMMIT went out to freeze after")
				}
			}
			// Exited with MariaDB still frozen (thawed below): it did not wait for it.
			if l := gaveUp(t, g); len(l) == 0 {
				t.Errorf("the gateway exited with MariaDB frozen without saying it gave up: want one of %q", gaveUpLines)
			} else {
				t.Logf("gave up: %q", l)
			}
			f.thaw()
			for _, s := range calls {
				<-s.done
			}
			if w.liveHolds() > 0 {
				w.startGateway("gw-reconciler")
				waitFor(t, 30*time.Second, "the reconciler to settle every hold", func() bool { return w.liveHolds() == 0 })
			}
			var total int64
			for i, s := range calls {
				r := w.hold(s.runID)
				total += r.ChargedMicro
				tl, _, _ := w.tally.Get(context.Background(), s.runID)
				// The reconciler charges the tally: a charge equal to a tally that was itself
				// wrong (a call counted twice) checked nothing. A call its client read whole
				// tallied its 20+5i output tokens at their price.
				if s.chunks >= 20+5*i && s.err == nil {
					w.tallyAtPrice(t, s.runID, int64(20+5*i))
				}
				if r.SettleSource.String == holds.SourceReconcileHold || r.ChargedMicro != tl.CostMicro || r.ChargedMicro <= 0 {
					t.Errorf("call %s: settled by %q charged %d, want what it used (tally %d)", s.runID, r.SettleSource.String, r.ChargedMicro, tl.CostMicro)
				}
				t.Logf("call %s: settled by %q charged %d", s.runID, r.SettleSource.String, r.ChargedMicro)
			}
			if got := w.ledgerUsed(u.ID); got != total {
				t.Errorf("day ledger %d, want %d", got, total)
			}
		})
	}
}

// TestSigtermFrozenRedis: SIGTERM while streams are in flight and Redis has stopped
// answering (packets dropped, not refused). The short streams end inside the drain, the long
// ones are cut at its deadline; every call must still be settled by the process itself at what
// it used (the settlement is the database's, the tally only evidence), and the process must
// exit without waiting for Redis.
func TestSigtermFrozenRedis(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term-redis-frozen", 10, nil)
	relay := newFreezer(t, w.redisAddr())
	g := w.startGatewayWith("gw-term-redis", w.writeConfig(map[string]string{"limits.shutdown_timeout": cutDrain.String()}),
		"REDIS_URL=redis://"+relay.addr()+"/0")
	var short, long []*stream
	for range 3 {
		short = append(short, startStream(t, g, key, 20, 50*time.Millisecond, nil))
	}
	for range 2 {
		long = append(long, startStream(t, g, key, 10_000, 20*time.Millisecond, nil))
	}
	relay.freeze()
	g.signal(t, syscall.SIGTERM)
	const settleTimeout = 10 * time.Second // the world's limits.settle_timeout
	// The wait's own deadline catches a hang; it does not measure the exit.
	if err := g.wait(t, cutDrain+settleTimeout+65*time.Second); err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
	relay.thaw()
	for _, s := range short {
		<-s.done
		w.settledAtPrice(t, s.runID, holds.SourceComplete, 20)
	}
	for _, s := range long {
		<-s.done
		w.cutAtItsText(t, s) // at what it used: the settlement is the database's, not the tally's
	}
	var total int64
	if err := w.db.Get(&total, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if got := w.ledgerUsed(u.ID); got != total {
		t.Errorf("day ledger %d, want %d", got, total)
	}
}

// TestSigtermCallArrivingDuringDrain: a client that connected before SIGTERM sends its request
// during the drain (net/http keeps such a fresh connection open and serves it). The call is
// admitted while shutdown is under way: it must be answered and settled by the process before
// it exits, or refused with nothing held — never left live.
func TestSigtermCallArrivingDuringDrain(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("term-late", 10, nil)
	g := w.startGateway("gw-term-late")
	keep := startStream(t, g, key, 10_000, 20*time.Millisecond, nil) // keeps the drain going
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Accepted first: a connection still in the listen queue when SIGTERM closes the listener
	// is reset by the kernel, never seen by the gateway — not the case this test is about.
	waitFor(t, 5*time.Second, "the gateway to accept the connection", func() bool { return acceptQueue(t, g) == 0 })
	g.signal(t, syscall.SIGTERM)
	// Inside the drain: the gateway says so when it starts it (no sleep hoping it has).
	waitFor(t, 10*time.Second, "the gateway to start its drain", func() bool {
		b, err := os.ReadFile(g.log)
		return err == nil && strings.Contains(string(b), "shutting down: draining calls in flight")
	})
	body := chatBody(false, 30, "arrived during the drain")
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nX-Fake-Chunks: 20\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	status := 0
	if err == nil {
		status = resp.StatusCode
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	t.Logf("request sent during the drain: status %d err %v", status, err)
	if err := g.wait(t, testShutdownDrain+15*time.Second); err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
	<-keep.done
	if n := w.liveHolds(); n != 0 {
		t.Errorf("%d holds left live", n)
	}
	var n int
	if err := w.db.Get(&n, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND settle_source = ?", u.ID, holds.SourceComplete); err != nil {
		t.Fatal(err)
	}
	var all int
	if err := w.db.Get(&all, "SELECT COUNT(*) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	switch {
	case status == http.StatusOK && n != 1:
		t.Errorf("the late call was answered 200, but %d runs settled complete, want 1", n)
	case status != http.StatusOK && all != 1:
		t.Errorf("the late call was refused (%d), but %d holds exist, want only the stream's", status, all)
	}
}

// Lines a shutting-down gateway logs when a deadline ends its wait — a settlement's own
// (settle_timeout), or the exit's bound (settle_timeout + 5 s past the drain): what it leaves,
// the reconciler settles. A process that exits with one in its log gave up at its deadline;
// one that exits without, had nothing left to wait for.
var gaveUpLines = []string{
	"settlement failed; the reconciler will settle this run",
	"settlement still queued at settle_timeout; it commits once a batch takes it, or the reconciler settles this run",
	"settlements still pending at exit; the reconciler will settle them",
	"batch writer still busy at exit; the reconciler will settle what it held",
}

// gaveUp reports which of gaveUpLines g's log has.
func gaveUp(t *testing.T, g *gateway) []string {
	t.Helper()
	b, err := os.ReadFile(g.log)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, l := range gaveUpLines {
		if strings.Contains(string(b), l) {
			found = append(found, l)
		}
	}
	return found
}

// acceptQueue is how many connections wait in g's listen queue, not yet accepted: the rx_queue
// the kernel shows for a listening socket in /proc/net/tcp.
func acceptQueue(t *testing.T, g *gateway) int {
	t.Helper()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(g.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	local := fmt.Sprintf("0100007F:%04X", p) // 127.0.0.1, as the kernel prints it
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		// sl local remote st tx_queue:rx_queue ...; st 0A is LISTEN.
		if len(f) < 5 || f[1] != local || f[3] != "0A" {
			continue
		}
		_, rx, _ := strings.Cut(f[4], ":")
		n, err := strconv.ParseInt(rx, 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	t.Fatalf("no listening socket on %s in /proc/net/tcp", local)
	return 0
}

// TestSecondSignalEndsTheDrain: an operator who sends SIGTERM (or Ctrl-C) again while the
// gateway drains wants it gone now, as most servers do. The second signal was swallowed and
// the drain ran its course (a minute here). Now the second kills the process as an
// unhandled signal does; what it leaves the reconciler settles, as after kill -9.
func TestSecondSignalEndsTheDrain(t *testing.T) {
	w := newWorld(t)
	_, key := w.user("twice", 10, nil)
	g := w.startGatewayWith("gw-twice", w.writeConfig(map[string]string{"limits.shutdown_timeout": "60s"}))
	s := startStream(t, g, key, 10_000, 20*time.Millisecond, nil)
	g.signal(t, syscall.SIGTERM)
	waitFor(t, 10*time.Second, "the drain to start", func() bool {
		b, _ := os.ReadFile(g.log)
		return strings.Contains(string(b), "draining calls in flight")
	})
	g.signal(t, syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway still drains 10 s after a second SIGTERM (its drain deadline is 60 s)")
	}
	var ee *exec.ExitError
	if !errors.As(g.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("exit %v, want killed by the second SIGTERM", g.err)
	}
	// Said before it goes: an operator reading the log knows the drain was abandoned.
	if b, _ := os.ReadFile(g.log); !strings.Contains(string(b), "second signal: drain abandoned") {
		t.Errorf("no line saying the drain was abandoned in the log:\n%s", tail(b, 2000))
	}
	<-s.done
}

// TestSigtermDrainLongerThanTheSettleBound: the exit's bound for what follows the drain
// (settle_timeout + 5 s: the cut calls' answers, their settlements, the batch writer, the
// row's retirement) counts from the drain's end. Counted from the signal, a drain longer than
// it left nothing: the cut stream got no error event, its settlement was abandoned (a
// reconciler later charged it its whole hold) and the row was left for others to find dead.
func TestSigtermDrainLongerThanTheSettleBound(t *testing.T) {
	w := newWorld(t)
	_, key := w.user("long-drain", 10, nil)
	// The bound (settle_timeout + 5 s) is 2 s shorter than the drain. The cut call's settlement
	// has settle_timeout to commit: at 1 s, a database a loaded machine slowed past that left
	// its hold live, the process gone, whatever the bound counts from.
	g := w.startGatewayWith("gw-long-drain", w.writeConfig(map[string]string{
		"limits.shutdown_timeout": "10s", "limits.settle_timeout": "3s"}))
	s := startStream(t, g, key, 100_000, 20*time.Millisecond, nil)
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, 30*time.Second); err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
	<-s.done
	if s.err != nil || !strings.Contains(s.last, `"code":"shutting_down"`) {
		t.Errorf("cut stream: ended with %v after %q; want a shutting_down error event and a clean end", s.err, s.last)
	}
	w.cutAtItsText(t, s) // settled by its process at what it used
	var live int
	if err := w.db.Get(&live, "SELECT COUNT(*) FROM instances WHERE name = ? AND dead_at IS NULL", "gw-long-drain"); err != nil {
		t.Fatal(err)
	}
	if live != 0 {
		t.Errorf("the gateway's row is not retired after its drain")
	}
}
