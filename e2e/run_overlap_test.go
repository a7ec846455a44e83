package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// The sidecar-in-front-of-agents deployment: one agent's calls of one X-Run-Id land on two
// gateway processes, and one of them is SIGKILLed mid-call. These tests pin what the run is
// charged, by whom, and its estimated mark, against the ledger.

// longRuns is a config whose named runs outlive the test: only the agent's settle (or a
// test's explicit wait for the reconciler) closes them.
func (w *world) longRuns() string {
	return w.writeConfig(map[string]string{"holds.run_ttl": "10m", "holds.hold_ttl": "10m"})
}

// settleRunWhenFree settles a named run on g, as an agent does: 409 run_busy (a call in
// flight, or a killed process's reservation and lease not lapsed yet) is retried; any other
// answer but 200 fails the test.
func settleRunWhenFree(t *testing.T, g *gateway, key, name string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(4 * testLeaseTTL)
	for {
		req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/runs/"+name+"/settle", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			var out map[string]any
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("settle %s: %v: %s", name, err, raw)
			}
			return out
		}
		if resp.StatusCode != http.StatusConflict || errorCodeOf(raw) != "run_busy" || time.Now().After(deadline) {
			t.Fatalf("settle %s on %s: %d %s", name, g.name, resp.StatusCode, raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func errorCodeOf(raw []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &e)
	return e.Error.Code
}

// checkRun asserts a settled named run's row: who settled it, its tokens, calls, cost and
// charge (no discount: charge = cost), its estimated mark; and that the day ledger is that
// charge alone.
func (w *world) checkRun(t *testing.T, userID uint64, runID, source string, use pricing.Usage, cost int64, calls int, estimated bool) {
	t.Helper()
	r := w.hold(runID)
	if r.State != holds.StateSettled || r.SettleSource.String != source || r.Calls != calls || r.InTok != use.Input ||
		r.OutTok != use.Output || r.CostMicro != cost || r.ChargedMicro != cost || r.Estimated != estimated {
		t.Errorf("run %s: %s by %q, calls %d in %d out %d cost %d charged %d estimated %v;\n"+
			"want settled by %q, calls %d in %d out %d cost = charged %d estimated %v",
			runID, r.State, r.SettleSource.String, r.Calls, r.InTok, r.OutTok, r.CostMicro, r.ChargedMicro, r.Estimated,
			source, calls, use.Input, use.Output, cost, estimated)
	}
	if r.ChargedMicro > r.CapMicro {
		t.Errorf("run %s charged %d over its cap %d", runID, r.ChargedMicro, r.CapMicro)
	}
	if got := w.ledgerUsed(userID); got != r.ChargedMicro {
		t.Errorf("day ledger %d, want the run's one charge %d", got, r.ChargedMicro)
	}
}

// TestRunCallsOnTwoProcessesOneKilled: calls of one named run overlap on gw-a and gw-b; gw-a is
// SIGKILLed in the middle of its call while gw-b's call completes. The agent settles the run on
// gw-b: that waits (run_busy) only until the dead call's reservation and lease lapse, and then
// charges, once, exactly the two calls that completed — gw-b's overlapping call is not lost
// beside the dead one, nor counted twice by the row and the tally. The dead call left no usage
// (README, Known limits): it is in neither the charge nor the mark, and its reservation is gone
// from the run's budget.
func TestRunCallsOnTwoProcessesOneKilled(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("overlap-kill", 10, nil)
	cfg := w.longRuns()
	a := w.startGatewayWith("gw-a", cfg)
	b := w.startGatewayWith("gw-b", cfg)
	const name = "overlap-kill"
	run := map[string]string{"X-Run-Id": name}

	runID, use1 := completeCall(t, b, key, chatBody(false, 40, "step 0"), with(run, "X-Fake-Chunks", "30"))
	dead := startStream(t, a, key, 5000, 20*time.Millisecond, run)
	if dead.runID != runID {
		t.Fatalf("gw-a's call ran as %s, want the run %s", dead.runID, runID)
	}
	// gw-b's call runs from start to end while gw-a's streams.
	use2, id2 := streamedCall(t, b, key, with(run, "X-Fake-Chunks", "50"))
	if id2 != runID {
		t.Fatalf("gw-b's second call ran as %s, want %s", id2, runID)
	}
	if n := len(w.reservations(runID)); n != 1 {
		t.Fatalf("reservations before the kill: %v, want gw-a's call alone", w.reservations(runID))
	}
	a.signal(t, syscall.SIGKILL)
	<-dead.done

	view := settleRunWhenFree(t, b, key, name)
	if view["state"] != "settled" || view["settle_source"] != holds.SourceClient {
		t.Fatalf("settle answer: %v", view)
	}
	want := use1.Add(use2)
	w.checkRun(t, u.ID, runID, holds.SourceClient, want, w.price.Cost(use1)+w.price.Cost(use2), 2, false)
	if left := w.reservations(runID); len(left) != 0 {
		t.Errorf("reservations after the settlement: %v, want none", left)
	}
	// A second settle, on either process, is an answer and not a charge.
	c := w.startGatewayWith("gw-c", cfg)
	settleRunWhenFree(t, c, key, name)
	w.checkRun(t, u.ID, runID, holds.SourceClient, want, w.price.Cost(use1)+w.price.Cost(use2), 2, false)
}

// lockRunRow takes a run's row lock in a transaction of the test's own, as a slow statement
// would: the run's RecordRunCall waits behind it. release rolls it back (once).
func (w *world) lockRunRow(runID string) (release func()) {
	w.t.Helper()
	return w.lockRow("SELECT run_id FROM run_holds WHERE run_id = ? FOR UPDATE", runID)
}

// waitingRecord waits until a RecordRunCall statement on this test's database waits (behind
// lockRunRow) and returns its connection's id. The server is shared with the other packages'
// tests, which run at the same time and record their own runs' calls: a statement of another
// database is not this run's record (and not the test's to kill).
func (w *world) waitingRecord(t *testing.T) int64 {
	t.Helper()
	var id int64
	waitFor(t, 10*time.Second, "the call's record to wait on the run's row", func() bool {
		err := w.db.Get(&id, `SELECT ID FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE '%INTO @tg_run_live FROM run_holds%'
			AND INFO NOT LIKE '%PROCESSLIST%' LIMIT 1`)
		return err == nil && id != 0
	})
	return id
}

// TestRunCallKilledBetweenTallyAndRecord: a named run's call on gw-a has ended and is in the
// run's tally (its reservation given back in the same step), but gw-a is SIGKILLed while the
// call's record on the run's row waits on the database, before its caller saw the answer's
// end. The call had no usage report. The record either never lands (its statement killed with
// the process's connection) or lands after the kill (already sent); whoever settles the run —
// the agent on gw-b, or gw-b's reconciler once the run expires — charges both calls once, the
// tally's figures (not the row's and the tally's added), and marks the run estimated, which in
// the first case only the tally says.
func TestRunCallKilledBetweenTallyAndRecord(t *testing.T) {
	killBetweenTallyAndRecord(t, holds.SourceClient)
}

// TestRunCallKilledBetweenTallyAndRecordReconciled is the same, the run left to the reconciler.
func TestRunCallKilledBetweenTallyAndRecordReconciled(t *testing.T) {
	killBetweenTallyAndRecord(t, holds.SourceReconcile)
}

// killBetweenTallyAndRecord runs TestRunCallKilledBetweenTallyAndRecord's scenario with the run
// settled by (source) the agent or the reconciler, once with the dead call's record lost and
// once with it landing after the kill.
func killBetweenTallyAndRecord(t *testing.T, by string) {
	for _, lands := range []bool{false, true} {
		t.Run(fmt.Sprintf("record_lands=%v", lands), func(t *testing.T) {
			w := newWorld(t)
			u, key := w.user("tally-kill", 10, nil)
			cfg := w.config // runs expire after testHoldTTL: the reconciler's case
			if by == holds.SourceClient {
				cfg = w.longRuns()
			}
			a := w.startGatewayWith("gw-a", cfg)
			b := w.startGatewayWith("gw-b", cfg)
			name := "tally-kill"
			run := map[string]string{"X-Run-Id": name}
			runID, use1 := completeCall(t, b, key, chatBody(false, 40, "step 0"), with(run, "X-Fake-Chunks", "30"))
			// Held after its first event until the run's row is locked: paced alone its 20
			// events ended in 1 s, and a loaded machine slower than that to lock the row saw
			// the record land before the lock, with nothing left waiting on it.
			held, letGo := w.holdStreams("tally-kill", with(run, "X-Fake-Usage", "off"))
			s := startStream(t, a, key, 20, 50*time.Millisecond, held)
			release := w.lockRunRow(runID)
			letGo()
			stmt := w.waitingRecord(t)
			tl, found, err := w.tally.Get(context.Background(), runID)
			if err != nil || !found || tl.Calls != 2 || tl.EstimatedCalls != 1 || tl.CostMicro <= w.price.Cost(use1) {
				t.Fatalf("tally %+v (found %v, %v): want gw-a's estimated call on top of step 0 (%d)", tl, found, err, w.price.Cost(use1))
			}
			a.signal(t, syscall.SIGKILL)
			if lands {
				release()
				waitFor(t, 10*time.Second, "the record sent before the kill to land", func() bool { return w.hold(runID).Calls == 2 })
			} else {
				if _, err := w.db.Exec(fmt.Sprintf("KILL QUERY %d", stmt)); err != nil {
					t.Fatalf("kill the dead process's statement: %v", err)
				}
				release()
				if r := w.hold(runID); r.Calls != 1 || r.Estimated {
					t.Fatalf("run's row after the kill: calls %d estimated %v, want gw-b's call alone recorded", r.Calls, r.Estimated)
				}
			}
			<-s.done
			if by == holds.SourceClient {
				settleRunWhenFree(t, b, key, name)
			} else {
				waitFor(t, 30*time.Second, "the reconciler to settle the run", func() bool { return w.liveHolds() == 0 })
			}
			w.checkRun(t, u.ID, runID, by, tl.Usage, tl.CostMicro, 2, true)
		})
	}
}

// TestRunOutlivesItsTTLOnOneProcessWhileAnotherIsKilled: with short run TTLs, gw-a is SIGKILLed
// in the middle of a named run's call while gw-b's call of the same run goes on past the run's
// expiry. gw-b's reconciler must not settle the run under its own call — the dead process's
// lease lapses, but gw-b's lease on the same run key stands for the call still running — and
// settles it only after that call has ended, from a tally that has it: the two completed calls,
// once, unmarked.
//
// Every call of the run is admitted while another of it is in flight: the dead call first, so
// that the step before it and gw-b's long call are each admitted under its lease, and gw-a is
// killed only once gw-b's call is streaming. Admitted one after another, each had the run's
// 3 s run_ttl from the last to come, and a loaded machine's pause found the run settled from
// its tally (409 run_settled).
func TestRunOutlivesItsTTLOnOneProcessWhileAnotherIsKilled(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("outlive-kill", 10, nil)
	a := w.startGateway("gw-a")
	b := w.startGateway("gw-b")
	run := map[string]string{"X-Run-Id": "outlive-kill"}
	dead := startStream(t, a, key, 5000, 20*time.Millisecond, run)
	runID, use1 := completeCall(t, b, key, chatBody(false, 40, "step 0"), with(run, "X-Fake-Chunks", "30"))
	if runID != dead.runID {
		t.Fatalf("gw-b's call ran as %s, want the run %s", runID, dead.runID)
	}
	// Streams for twice the run's TTL after its admission pushed the expiry out.
	use2, _ := streamedCallThen(t, b, key, with(with(run, "X-Fake-Chunks", "300"), "X-Fake-Chunk-Interval", "20ms"), func() {
		a.signal(t, syscall.SIGKILL)
		<-dead.done
	})
	waitFor(t, 30*time.Second, "the reconciler to settle the run", func() bool { return w.liveHolds() == 0 })
	// The premise: the reconciler found the run expired under gw-b's call, and only extended it.
	if m := grepLines(scrape(t, b), `tollgate_reconciled_total{outcome="extended"}`); m == "" {
		t.Errorf("gw-b's reconciler never found the run expired under its call: the test did not test")
	}
	w.checkRun(t, u.ID, runID, holds.SourceReconcile, use1.Add(use2), w.price.Cost(use1)+w.price.Cost(use2), 2, false)
}

// TestRunFirstCallKilledThenContinued: a named run's first call is SIGKILLed on gw-a before any
// call of the run was tallied; the agent goes on on gw-b and settles. The run is not charged
// its hold (as it would be, had nobody come back): it has a tally now, and is charged exactly
// the call that completed, once — the dead call left no usage (README, Known limits).
func TestRunFirstCallKilledThenContinued(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("first-kill", 10, nil)
	cfg := w.longRuns()
	a := w.startGatewayWith("gw-a", cfg)
	b := w.startGatewayWith("gw-b", cfg)
	const name = "first-kill"
	run := map[string]string{"X-Run-Id": name}
	dead := startStream(t, a, key, 5000, 20*time.Millisecond, run)
	a.signal(t, syscall.SIGKILL)
	<-dead.done
	runID, use := completeCall(t, b, key, chatBody(false, 40, "step 1"), with(run, "X-Fake-Chunks", "30"))
	if runID != dead.runID {
		t.Fatalf("gw-b's call ran as %s, want the run %s", runID, dead.runID)
	}
	settleRunWhenFree(t, b, key, name)
	w.checkRun(t, u.ID, runID, holds.SourceClient, use, w.price.Cost(use), 1, false)
}
