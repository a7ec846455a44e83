package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestGatewayPausedPastItsHolds is DESIGN §5 under a fault no kill shows: a gateway process is
// PAUSED (SIGSTOP: a long GC pause, a VM live migration, `docker pause`) with calls of every
// kind in flight, for longer than its leases and its holds live, while a second gateway on the
// same MariaDB and Redis goes on serving and reconciling; then it is RESUMED (SIGCONT) and
// finishes its calls, whose clients are still connected.
//
// To the peer the paused process looks dead: its leases lapse and the peer's reconciler settles
// its expired holds (from the tally, or at held_micro) — the test waits for exactly that in the
// database. Meanwhile the callers go on on the live gateway: the same Idempotency-Keys, the same
// sessions' messages, the same named runs, the same plain body inside the fingerprint window.
// Once resumed, the slow process's settlements must change nothing ("first settlement wins"),
// and nothing it writes may undo what the live process did. Then the books are audited by the
// chaos rules, row by row:
//
//   - every hold settled once, the day ledger the sum of the charges (holds.Audit), no charge
//     above its cap;
//   - every run the peer settled while the process was paused is exactly as the peer settled
//     it (state, source, charge, usage, settled_at) after the resumed process has settled its
//     calls, and the resumed process counted those settlements as not applied;
//   - a call the live gateway served to its end is charged its price, a named run the agent
//     settled the sum of its calls (the resumed one's too: it ended before the settle);
//   - the key's stored answer, the sessions' current runs and the settled named run are what
//     the live gateway made them: a replay on either gateway gives the answer of the attempt
//     the live gateway ran, not the one the resumed process finished after it;
//   - no lease, reservation or fingerprint is left behind, and a fresh call of every kind, on
//     both gateways, gets its answer (a settled run's gets 409 run_settled, as README says);
//   - no caller got a 500, and the resumed process logged no error.
//
// Expected by README "Known limits", and so not failures: a call outliving its hold is settled
// as a dead process's (its own usage, ending after, is not charged: its hold is, less what a
// one-call run's hold exceeded that usage by, given back by grant); an
// Idempotency-Key retry after that settlement runs the key again (two answers, both charged).
func TestGatewayPausedPastItsHolds(t *testing.T) {
	w := newWorld(t)
	// The fingerprint window on: a plain body resent on the live gateway meets the paused
	// process's fingerprint.
	w.config = w.writeConfig(map[string]string{"dedup.window": "5s"})
	u, key := w.user("paused", 40, nil)
	p := w.startGateway("gw-paused")
	l := w.startGateway("gw-live")
	var all allCalls
	ctx := context.Background()

	// Done on p before the pause: a pinned key, a plain call, the first call of agent-A.
	fast := map[string]string{"X-Fake-Chunks": "12"}
	kDone := all.must(t, "k-done on p", p, key, chatRequest(false, 40, "idempotent, done before the pause"),
		with(fast, "Idempotency-Key", "k-done"))
	control := all.must(t, "plain on p", p, key, chatRequest(false, 40, "a plain call before the pause"), fast)
	agentA1 := all.must(t, "agent-A call 1 on p", p, key, chatRequest(false, 40, "agent A step 1"), with(fast, "X-Run-Id", "agent-A"))
	// Their settlements (a plain call's, a pinned key's) and agent-A's tally have landed:
	// nothing of p's is half-way through a money transaction when it stops.
	for _, id := range []string{kDone.runID, control.runID} {
		waitFor(t, 10*time.Second, "settlement of "+id, func() bool { return w.hold(id).State == holds.StateSettled })
	}
	waitFor(t, 10*time.Second, "agent-A's tally", func() bool {
		tl, found, err := w.tally.Get(ctx, agentA1.runID)
		return err == nil && found && tl.Calls == 1
	})

	// In flight on p at the pause: slow streams (their remaining events come after the resume)
	// and a whole answer the upstream keeps back.
	slow := map[string]string{"X-Fake-Chunks": "80", "X-Fake-Chunk-Interval": "40ms"}
	fpBody := chatRequest(true, 100, "a plain stream the pause catches")
	kStreamBody := chatRequest(true, 100, "an idempotent stream the pause catches")
	sameMsg := chatRequest(true, 100, "session same: the message sent again")
	inflight := map[string]*pending{
		"plain stream":   all.start(t, p, key, fpBody, slow),
		"plain whole":    all.start(t, p, key, chatRequest(false, 100, "a whole answer the pause catches"), map[string]string{"X-Fake-Chunks": "30", "X-Fake-Latency": "4s"}),
		"k-stream #0":    all.start(t, p, key, kStreamBody, with(slow, "Idempotency-Key", "k-stream")),
		"agent-A call 2": all.start(t, p, key, chatRequest(true, 100, "agent A step 2"), with(slow, "X-Run-Id", "agent-A")),
		"agent-B call 1": all.start(t, p, key, chatRequest(true, 100, "agent B step 1"), with(slow, "X-Run-Id", "agent-B")),
		"s-same #1":      all.start(t, p, key, sameMsg, with(slow, "X-Session-Id", "s-same")),
		"s-new #1":       all.start(t, p, key, chatRequest(true, 100, "session new: the first message"), with(slow, "X-Session-Id", "s-new")),
	}
	for name, c := range inflight {
		if name == "plain whole" {
			continue // answered whole: nothing arrives before the upstream's latency
		}
		c.waitFirst(t, name)
	}
	// The whole answer's hold is in: its admission has committed.
	waitFor(t, 10*time.Second, "the whole answer's hold", func() bool { return w.liveHoldsOf(u.ID) == 7 })
	runsOnP := map[string]string{} // name -> run id of the calls p serves
	for name, c := range inflight {
		if name != "plain whole" {
			runsOnP[name] = c.runID()
		}
	}
	var wholeID string
	if err := w.db.Get(&wholeID, `SELECT run_id FROM run_holds WHERE user_id = ? AND state = 'running' AND client_run_id IS NULL
		AND run_id NOT IN (?, ?, ?, ?)`, u.ID, runsOnP["plain stream"], runsOnP["k-stream #0"], runsOnP["s-same #1"], runsOnP["s-new #1"]); err != nil {
		t.Fatalf("the whole answer's run: %v", err)
	}
	runsOnP["plain whole"] = wholeID
	if runsOnP["agent-A call 2"] != agentA1.runID {
		t.Fatalf("agent-A's second call ran as %s, its first as %s", runsOnP["agent-A call 2"], agentA1.runID)
	}

	// agent-B goes on on the live gateway, first with a call held there mid-stream until the
	// paused process is resumed: a live process's call, its lease beaten, the run is never the
	// peer's to settle, however long the steps below take. Kept alive by its calls' admissions
	// alone (each pushing its expiry out by the 3 s run_ttl), it was only as safe as a loaded
	// machine was quick: a pause of 3 s between the stop and its first call on the live
	// gateway, or between two of them, had the peer settle it under the paused call.
	heldB, letGoB := w.holdStreams("agent-B", with(slow, "X-Run-Id", "agent-B"))
	agentBHeld := all.start(t, l, key, chatRequest(true, 100, "agent B held on the live gateway"), heldB)
	agentBHeld.waitFirst(t, "agent-B held on the live gateway")

	// The test holds the reconcile lock from before the stop until the calls made at once
	// below have been answered: no reconciler settles the paused process's holds before them.
	// Left to the leases' 2 s after the stop, a loaded machine's slower calls came after the
	// peer's settlement, and the key's retry ran its attempt 1 then, which the retry below it
	// found already answered (replayed); the plain body resent ran, and was a duplicate later.
	releaseLock := w.takeReconcileLock(t)

	// SIGSTOP.
	p.signal(t, syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	t.Logf("gw-paused stopped at %s (database time) with %d calls in flight", w.dbNow().Format(time.RFC3339Nano), len(inflight))

	// At once, before the peer can take the paused process for dead (the lock is the test's):
	// what the callers get while its holds still stand is README's, not this test's, to say;
	// logged.
	early := map[string]seen{
		"k-stream retry":    all.call(l, key, kStreamBody, with(fast, "Idempotency-Key", "k-stream")),
		"same plain body":   all.call(l, key, fpBody, fast),
		"s-new new message": all.call(l, key, chatRequest(true, 100, "session new: the second message"), with(fast, "X-Session-Id", "s-new")),
		"k-done retry":      all.call(l, key, chatRequest(false, 40, "idempotent, done before the pause"), with(fast, "Idempotency-Key", "k-done")),
	}
	releaseLock()
	for name, s := range early {
		t.Logf("during the pause, before the peer reconciled: %-17s -> %d %s (run %s, replayed %v)", name, s.status, s.code, s.runID, s.replayed)
	}
	if s := early["k-done retry"]; s.status != http.StatusOK || !s.replayed || s.runID != kDone.runID || string(s.body) != string(kDone.body) {
		t.Errorf("k-done retried on the live gateway: %d replayed %v run %s, want the pinned answer of %s replayed", s.status, s.replayed, s.runID, kDone.runID)
	}
	if s := early["s-new new message"]; !s.complete {
		t.Errorf("s-new's new message on the live gateway: %d %s, want its whole answer", s.status, s.code)
	}
	if s := early["k-stream retry"]; s.code != "request_in_progress" && s.status != http.StatusOK {
		t.Errorf("k-stream retried while its attempt's lease stood: %d %s, want 409 request_in_progress (or a run, had the peer been quicker)", s.status, s.code)
	}
	if s := early["same plain body"]; s.code != "duplicate" && s.status != http.StatusOK {
		t.Errorf("the paused plain stream's body resent on the live gateway: %d %s, want 409 duplicate (or a run, had the peer been quicker)", s.status, s.code)
	}

	// agent-B's calls go on on the live gateway beside its held one.
	stopB := make(chan struct{})
	var agentB []seen
	var bwg sync.WaitGroup
	bwg.Add(1)
	go func() {
		defer bwg.Done()
		for i := 0; ; i++ {
			s := all.call(l, key, chatRequest(false, 40, fmt.Sprintf("agent B step on the live gateway %d", i)), with(fast, "X-Run-Id", "agent-B"))
			agentB = append(agentB, s)
			if !s.complete {
				return
			}
			select {
			case <-stopB:
				return
			case <-time.After(400 * time.Millisecond):
			}
		}
	}()

	// The peer's reconciler takes the paused process for dead: every one-call run it serves and
	// agent-A (idle but for its paused call) are settled by the reconciler.
	reconciledOnP := []string{"plain stream", "plain whole", "k-stream #0", "agent-A call 2", "s-same #1", "s-new #1"}
	waitFor(t, 30*time.Second, "the peer's reconciler to settle the paused process's holds", func() bool {
		for _, name := range reconciledOnP {
			if w.hold(runsOnP[name]).State != holds.StateSettled {
				return false
			}
		}
		return true
	})
	peerSettled := map[string]holds.Run{}
	for _, name := range reconciledOnP {
		r := w.hold(runsOnP[name])
		peerSettled[name] = r
		t.Logf("settled under the paused process: %-15s %s %-14s charged %6d (held %d, cap %d)", name, r.RunID, r.SettleSource.String, r.ChargedMicro, r.HeldMicro, r.CapMicro)
		if src := r.SettleSource.String; src != holds.SourceReconcile && src != holds.SourceReconcileHold && !(name == "s-new #1" && src == holds.SourceCancel) {
			t.Errorf("%s (run %s) settled by %q under the paused process, want the reconciler", name, r.RunID, src)
		}
	}
	if r := peerSettled["agent-A call 2"]; r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != w.price.Cost(agentA1.usage) {
		t.Errorf("agent-A settled by %s charged %d, want its tally (call 1): %d", r.SettleSource.String, r.ChargedMicro, w.price.Cost(agentA1.usage))
	}

	// The same callers, on the live gateway, now that the paused process's runs are settled.
	kStream1 := all.call(l, key, kStreamBody, with(fast, "Idempotency-Key", "k-stream"))
	kStream1Replay := all.call(l, key, kStreamBody, with(fast, "Idempotency-Key", "k-stream"))
	sSame2 := all.call(l, key, sameMsg, with(fast, "X-Session-Id", "s-same"))
	agentA3 := all.call(l, key, chatRequest(false, 40, "agent A step 3"), with(fast, "X-Run-Id", "agent-A"))
	fpAgain := all.call(l, key, fpBody, fast)
	// README: the key's attempt was settled, so the retry runs it again (attempt 1).
	if !kStream1.complete || kStream1.replayed || kStream1.runID != testIdemRunID(u.ID, "k-stream", 1) {
		t.Errorf("k-stream retried after its attempt was reconciled: %d %s replayed %v run %s, want attempt 1 (%s) run to its end",
			kStream1.status, kStream1.code, kStream1.replayed, kStream1.runID, testIdemRunID(u.ID, "k-stream", 1))
	}
	if !kStream1Replay.replayed || kStream1Replay.runID != kStream1.runID || string(kStream1Replay.body) != string(kStream1.body) {
		t.Errorf("k-stream retried again: %d replayed %v run %s, want attempt 1's answer replayed", kStream1Replay.status, kStream1Replay.replayed, kStream1Replay.runID)
	}
	if !sSame2.complete {
		t.Errorf("s-same's message sent again after its run was reconciled: %d %s, want it run", sSame2.status, sSame2.code)
	}
	if agentA3.status != http.StatusConflict || agentA3.code != "run_settled" {
		t.Errorf("agent-A's next call after the reconciler settled it: %d %s, want 409 run_settled", agentA3.status, agentA3.code)
	}
	if !fpAgain.complete {
		t.Errorf("the paused plain stream's body resent after its run was reconciled: %d %s, want it run", fpAgain.status, fpAgain.code)
	}
	close(stopB)
	bwg.Wait()
	for i, s := range agentB {
		if !s.complete || s.runID != runsOnP["agent-B call 1"] {
			t.Errorf("agent-B call %d on the live gateway: %d %s run %s, want its answer in run %s", i, s.status, s.code, s.runID, runsOnP["agent-B call 1"])
		}
	}
	if r := w.hold(runsOnP["agent-B call 1"]); r.State == holds.StateSettled {
		t.Errorf("agent-B, kept alive by its calls on the live gateway, was settled by %s under the paused call", r.SettleSource.String)
	}

	// SIGCONT: the paused process finishes its calls; their clients are still connected.
	p.signal(t, syscall.SIGCONT)
	stopped = false
	t.Logf("gw-paused resumed at %s (database time)", w.dbNow().Format(time.RFC3339Nano))
	for name, c := range inflight {
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no end 30s after the resume", name)
		}
		s := c.res
		t.Logf("after the resume: %-15s -> %d complete %v code %q run %s", name, s.status, s.complete, s.code, s.runID)
		if name != "s-new #1" && !s.complete {
			t.Errorf("%s on the resumed process: %d complete %v code %q err %v, want its whole answer", name, s.status, s.complete, s.code, s.err)
		}
		if name == "s-new #1" && !s.complete && s.code != "superseded" {
			t.Errorf("s-new #1 on the resumed process: %d code %q err %v, want its answer or a last superseded event", s.status, s.code, s.err)
		}
	}
	letGoB()
	<-agentBHeld.done
	if s := agentBHeld.res; !s.complete || s.runID != runsOnP["agent-B call 1"] {
		t.Errorf("agent-B's held call on the live gateway: %d %s run %s, want its answer in run %s", s.status, s.code, s.runID, runsOnP["agent-B call 1"])
	}
	// The named run the agent goes on with: every call of it has ended (the resumed one too),
	// so its settle charges them all.
	waitSettledOnRequest(t, l, key, "agent-B")
	waitFor(t, 20*time.Second, "every hold settled", func() bool { return w.liveHoldsOf(u.ID) == 0 })

	// The books.
	rows, byID, _, _ := readRunRows(t, w)
	var total int64
	for _, r := range rows {
		total += r.ChargedMicro
		if r.State != holds.StateSettled {
			t.Errorf("run %s: %s, want settled", r.RunID, r.State)
		}
		if r.ChargedMicro > r.CapMicro || r.ChargedMicro < 0 {
			t.Errorf("run %s (%s): charged %d, cap %d", r.RunID, r.SettleSource.String, r.ChargedMicro, r.CapMicro)
		}
	}
	bad, err := holds.Audit(ctx, w.db)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range bad {
		t.Errorf("ledger audit: user %d day %s run %s: %s", m.UserID, m.Day, m.RunID, m.Detail)
	}
	if used := w.ledgerUsed(u.ID); used != total {
		t.Errorf("day ledger %d, Σ charged %d", used, total)
	}
	// The resumed process's settlements of what the peer had settled changed nothing.
	for name, before := range peerSettled {
		after := byID[before.RunID]
		if after.ChargedMicro != before.ChargedMicro || after.SettleSource != before.SettleSource || after.SettledAt != before.SettledAt ||
			after.CostMicro != before.CostMicro || after.InTok != before.InTok || after.OutTok != before.OutTok || after.Calls != before.Calls {
			t.Errorf("%s (run %s) changed after the resume: %s charged %d cost %d in %d out %d calls %d settled %v, the peer's was %s charged %d cost %d in %d out %d calls %d settled %v",
				name, before.RunID, after.SettleSource.String, after.ChargedMicro, after.CostMicro, after.InTok, after.OutTok, after.Calls, after.SettledAt.Time,
				before.SettleSource.String, before.ChargedMicro, before.CostMicro, before.InTok, before.OutTok, before.Calls, before.SettledAt.Time)
		}
	}
	noOps := 0.0
	pm := scrape(t, p)
	for line := range strings.SplitSeq(pm, "\n") {
		if strings.HasPrefix(line, "tollgate_settlements_total{") && strings.Contains(line, `applied="false"`) {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			noOps += v
		}
	}
	// The one-call runs (plain, the key's attempt, the sessions' messages) settle themselves
	// when they end: five settlements that found their run settled.
	if noOps < 5 {
		t.Errorf("the resumed process counted %v settlements as not applied, want at least 5:\n%s", noOps, grepLines(pm, "tollgate_settlements_total"))
	}
	// What the live gateway served whole is charged its price.
	exact := map[string]seen{"k-stream #1": kStream1, "s-same #2": sSame2, "plain again": fpAgain, "s-new #2": early["s-new new message"]}
	for name, s := range exact {
		r, ok := byID[s.runID]
		if want := w.price.Cost(s.usage); !ok || r.SettleSource.String != holds.SourceComplete || r.ChargedMicro != min(want, r.CapMicro) {
			t.Errorf("%s (run %s) on the live gateway: %s charged %d, want complete at its price %d", name, s.runID, r.SettleSource.String, r.ChargedMicro, want)
		}
	}
	// agent-B: every call its agent saw end, the resumed one's included.
	sumB := w.price.Cost(inflight["agent-B call 1"].res.usage) + w.price.Cost(agentBHeld.res.usage)
	for _, s := range agentB {
		sumB += w.price.Cost(s.usage)
	}
	if r := byID[runsOnP["agent-B call 1"]]; r.SettleSource.String != holds.SourceClient || r.ChargedMicro != min(sumB, r.CapMicro) || r.Calls != 2+len(agentB) {
		t.Errorf("agent-B: %s charged %d for %d calls, want client at %d for %d calls", r.SettleSource.String, r.ChargedMicro, r.Calls, min(sumB, r.CapMicro), 2+len(agentB))
	}

	// What the live gateway made of the key, the sessions and the runs stands.
	rec, err := w.rdb.HGetAll(ctx, w.keys.Replay(testIdemRunID(u.ID, "k-stream", 0))).Result()
	if err != nil {
		t.Fatal(err)
	}
	if rec["run"] != kStream1.runID || rec["superseded"] != "" {
		t.Errorf("k-stream's record after the resume pins run %q (superseded %q), the live gateway pinned %s", rec["run"], rec["superseded"], kStream1.runID)
	}
	for _, g := range []*gateway{l, p} {
		s := all.call(g, key, kStreamBody, with(fast, "Idempotency-Key", "k-stream"))
		if !s.replayed || s.runID != kStream1.runID || string(s.body) != string(kStream1.body) {
			t.Errorf("k-stream retried on %s after the resume: %d %s replayed %v run %s, want the answer of attempt 1 (%s) that the live gateway pinned",
				g.name, s.status, s.code, s.replayed, s.runID, kStream1.runID)
		}
	}
	for sess, want := range map[string]string{"s-same": sSame2.runID, "s-new": early["s-new new message"].runID} {
		var cur string
		if err := w.db.Get(&cur, "SELECT current_run_id FROM sessions WHERE user_id = ? AND session_id = ?", u.ID, sess); err != nil {
			t.Fatal(err)
		}
		if cur != want {
			t.Errorf("session %s's current run is %s after the resume, the live gateway made it %s", sess, cur, want)
		}
	}
	if v := getJSON(t, l, key, http.MethodGet, "/v1/runs/agent-A"); v["settle_source"] != holds.SourceReconcile {
		t.Errorf("GET /v1/runs/agent-A after the resume: %v, want the peer's settlement from the tally", v)
	}
	waitFor(t, 3*testLeaseTTL, "no lease left", func() bool { return len(w.leaseKeys()) == 0 })
	for _, id := range []string{agentA1.runID, runsOnP["agent-B call 1"]} {
		if res := w.reservations(id); len(res) > 0 {
			t.Errorf("run %s keeps reservations after every call ended: %v", id, res)
		}
	}

	// A fresh call of every kind on both gateways.
	for _, g := range []*gateway{l, p} {
		tag := g.name
		for name, want := range map[string]struct {
			body []byte
			hdr  map[string]string
			code string // "" for a whole answer
		}{
			"plain whole":       {chatRequest(false, 40, "fresh plain on "+tag), fast, ""},
			"plain stream":      {chatRequest(true, 40, "fresh stream on "+tag), fast, ""},
			"the paused body":   {fpBody, fast, ""},
			"new key":           {chatRequest(false, 40, "fresh key on "+tag), with(fast, "Idempotency-Key", "k-fresh-"+tag), ""},
			"new named run":     {chatRequest(false, 40, "fresh run on "+tag), with(fast, "X-Run-Id", "agent-fresh-"+tag), ""},
			"agent-A":           {chatRequest(false, 40, "agent A late on "+tag), with(fast, "X-Run-Id", "agent-A"), "run_settled"},
			"agent-B":           {chatRequest(false, 40, "agent B late on "+tag), with(fast, "X-Run-Id", "agent-B"), "run_settled"},
			"s-same next":       {chatRequest(true, 40, "session same: next on "+tag), with(fast, "X-Session-Id", "s-same"), ""},
			"s-new next":        {chatRequest(true, 40, "session new: next on "+tag), with(fast, "X-Session-Id", "s-new"), ""},
			"s-same regenerate": {sameMsg, with(fast, "X-Session-Id", "s-same-"+tag), ""},
		} {
			s := all.call(g, key, want.body, want.hdr)
			switch {
			case want.code == "" && !s.complete:
				t.Errorf("fresh %s on %s after the resume: %d %s, want its whole answer", name, tag, s.status, s.code)
			case want.code != "" && s.code != want.code:
				t.Errorf("fresh %s on %s after the resume: %d %s, want %s", name, tag, s.status, s.code, want.code)
			}
		}
	}
	waitFor(t, 20*time.Second, "the fresh calls settled", func() bool { return w.liveHoldsOf(u.ID) == 0 })
	if bad, err := holds.Audit(ctx, w.db); err != nil || len(bad) > 0 {
		t.Errorf("ledger audit after the fresh calls: %v %+v", err, bad)
	}

	// No caller got a 500; the resumed process logged no error.
	all.noServerErrors(t)
	all.mu.Lock()
	t.Logf("%d calls in all", len(all.seen))
	all.mu.Unlock()
	b, _ := os.ReadFile(p.log)
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(l, `"level":"error"`) || strings.Contains(l, "DATA RACE") {
			t.Errorf("gw-paused logged: %s", l)
		}
	}
}

// takeReconcileLock takes the reconcile lock for the test, once no process holds it (a pass
// lets it lapse, reconcile_lock_ttl after it asked), and returns the func that gives it back:
// until then no gateway's reconciler settles anything. The lock is taken with a minute's TTL,
// as a process takes it, so that a test that ends without giving it back cannot stop the
// world's reconcilers for good.
func (w *world) takeReconcileLock(t *testing.T) (release func()) {
	t.Helper()
	lock := w.keys.ReconcileLock()
	waitFor(t, 10*time.Second, "the reconcile lock to be free for the test", func() bool {
		ok, err := w.rdb.SetNX(context.Background(), lock, "e2e-test", time.Minute).Result()
		return err == nil && ok
	})
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := w.rdb.Del(context.Background(), lock).Err(); err != nil {
				t.Errorf("give the reconcile lock back: %v", err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// liveHoldsOf counts a user's holds still queued or running.
func (w *world) liveHoldsOf(userID uint64) int {
	w.t.Helper()
	var n int
	if err := w.db.Get(&n, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND state IN ('queued', 'running')", userID); err != nil {
		w.t.Fatal(err)
	}
	return n
}

// settleRunOn sends POST /v1/runs/{name}/settle to g.
func settleRunOn(t *testing.T, g *gateway, key, name string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/runs/"+name+"/settle", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

// waitSettledOnRequest settles the named run on g once it may be (its calls ended: 409 while
// one runs, 503 while the database or Redis is away), within 30 s, and returns what the settle
// answered. Any other refusal fails the test.
func waitSettledOnRequest(t *testing.T, g *gateway, key, name string) map[string]any {
	t.Helper()
	var settled map[string]any
	waitFor(t, 30*time.Second, name+" settled on request", func() bool {
		code, out := settleRunOn(t, g, key, name)
		switch code {
		case http.StatusOK:
			settled = out
			return true
		case http.StatusConflict, http.StatusServiceUnavailable:
			return false
		}
		t.Fatalf("settle %s: %d %v", name, code, out)
		return false
	})
	t.Logf("%s settled: %v", name, settled)
	return settled
}

// seen is what a caller saw of one chat completion.
type seen struct {
	status   int
	runID    string
	replayed bool
	code     string // a refusal's error code, or a stream's error event's
	complete bool   // the whole answer with its usage report (a stream's [DONE] too)
	usage    pricing.Usage
	body     []byte // everything read
	err      error
}

// pending is a call under way.
type pending struct {
	first chan struct{} // its first event arrived, or it ended
	done  chan struct{}
	res   seen // valid after done
	id    string
	mu    sync.Mutex
}

func (c *pending) waitFirst(t *testing.T, name string) {
	t.Helper()
	select {
	case <-c.first:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: no first event within 15s", name)
	}
	select {
	case <-c.done:
		t.Fatalf("%s ended before the pause: %d %s %v", name, c.res.status, c.res.code, c.res.err)
	default:
	}
}

func (c *pending) runID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.id
}

// allCalls keeps what every caller saw, for the check that none got a 500.
type allCalls struct {
	mu   sync.Mutex
	seen []seen
}

// start sends a call and returns at once; the call reads its answer to the end.
func (a *allCalls) start(t *testing.T, g *gateway, key string, body []byte, hdr map[string]string) *pending {
	c := &pending{first: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	go func() {
		defer close(c.done)
		var once sync.Once
		first := func() { once.Do(func() { close(c.first) }) }
		defer first()
		c.res = readCall(ctx, g, key, body, hdr, func(runID string) {
			c.mu.Lock()
			c.id = runID
			c.mu.Unlock()
			first()
		})
		a.mu.Lock()
		a.seen = append(a.seen, c.res)
		a.mu.Unlock()
	}()
	return c
}

// call sends a call and waits for its end.
func (a *allCalls) call(g *gateway, key string, body []byte, hdr map[string]string) seen {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := readCall(ctx, g, key, body, hdr, nil)
	a.mu.Lock()
	a.seen = append(a.seen, s)
	a.mu.Unlock()
	return s
}

// must is call for one that must get its whole answer.
func (a *allCalls) must(t *testing.T, what string, g *gateway, key string, body []byte, hdr map[string]string) seen {
	t.Helper()
	s := a.call(g, key, body, hdr)
	if !s.complete {
		t.Fatalf("%s: %d %s %v %s", what, s.status, s.code, s.err, s.body)
	}
	return s
}

// noServerErrors checks that no caller got a 5xx.
func (a *allCalls) noServerErrors(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.seen {
		if s.status >= 500 {
			t.Errorf("a caller got %d %s (run %s)", s.status, s.code, s.runID)
		}
	}
}

// readCall sends one chat completion and reads its answer to the end; firstEvent, if set, is
// called with the run id when a stream's first content event arrives.
func readCall(ctx context.Context, g *gateway, key string, body []byte, hdr map[string]string, firstEvent func(string)) seen {
	var s seen
	resp, err := do(ctx, g, key, body, hdr)
	if err != nil {
		s.err = err
		return s
	}
	defer resp.Body.Close()
	s.status, s.runID = resp.StatusCode, resp.Header.Get(RunIDHeaderForTests)
	s.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		s.body, s.err = io.ReadAll(resp.Body)
		var out chatChunk
		if s.err == nil && json.Unmarshal(s.body, &out) == nil {
			if out.Error != nil {
				s.code = out.Error.Code
			}
			if out.Usage != nil && s.status == http.StatusOK {
				s.complete, s.usage = true, out.usage()
			}
		}
		return s
	}
	var all strings.Builder
	var done, sawUsage bool
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		all.WriteString(sc.Text() + "\n")
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			continue
		}
		var ev chatChunk
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		if ev.Error != nil {
			s.code = ev.Error.Code
		}
		if ev.Usage != nil {
			sawUsage, s.usage = true, ev.usage()
		}
		if len(ev.Choices) > 0 && firstEvent != nil {
			firstEvent(s.runID)
			firstEvent = nil
		}
	}
	s.body, s.err = []byte(all.String()), sc.Err()
	s.complete = s.status == http.StatusOK && done && sawUsage && s.err == nil && s.code == ""
	return s
}
