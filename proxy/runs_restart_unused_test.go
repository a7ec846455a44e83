package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/jmoiron/sqlx"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestNamedRunThatUsedNothingIsNotChargedItsHoldAfterARedisRestart: the only call of a named run
// fails upstream (a 503 before anything is produced: it used nothing), then Redis restarts
// without persistence (the run's keys are gone) and the agent never comes back. README: "Nothing
// used is recorded as a zero tally, so a run nobody comes back to is settled at what it used,
// possibly 0" and the run's row "records each ended call too ... so a Redis restart without
// persistence mid-run ... loses no call that had ended". The run must settle at 0, not at its
// hold, both when the reconciler finds it and when the agent settles it.
func TestNamedRunThatUsedNothingIsNotChargedItsHoldAfterARedisRestart(t *testing.T) {
	for _, via := range []string{"reconciler", "settle"} {
		t.Run(via, func(t *testing.T) {
			h := newHarness(t, nil)
			u, key := h.user("standard")
			name := "unused-" + via
			resp := h.post(key, "/v1/chat/completions", chatBody,
				map[string]string{"X-Run-Id": name, fakellm.HeaderStatus: "503"})
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 500 {
				t.Fatalf("call: %d %s, want the upstream's failure", resp.StatusCode, body)
			}
			runID := resp.Header.Get(proxy.RunIDHeader)
			h.settled()
			ctx := context.Background()
			if _, found, err := h.tally.Get(ctx, runID); err != nil || !found {
				t.Fatalf("zero tally before the restart: found=%v err=%v", found, err)
			}
			loseRunKeys(t, h, runID)
			// Old enough that a run without a tally is no longer taken for one whose first
			// call is still reserving, and expired, as a run nobody came back to is.
			if _, err := h.db.Exec(`UPDATE run_holds SET created_at = NOW(6) - INTERVAL 1 DAY,
				expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = ?`, runID); err != nil {
				t.Fatal(err)
			}
			switch via {
			case "reconciler":
				rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally},
					Leases: noLeases{}, Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute})
				if _, err := rec.RunOnce(ctx); err != nil {
					t.Fatal(err)
				}
			case "settle":
				if status, body := settleAfterRebuild(h, key, name, runID); status != http.StatusOK {
					t.Fatalf("settle: %d %s", status, body)
				}
			}
			r := h.run(u.ID, runID)
			if r.State != holds.StateSettled || r.ChargedMicro != 0 {
				t.Fatalf("run whose only call used nothing settled as %s, charged %d µUSD (held %d, source %s); want 0",
					r.State, r.ChargedMicro, r.HeldMicro, r.SettleSource.String)
			}
		})
	}
}

// TestSettleAtAnAnswersEndAfterARedisRestartChargesThatCall: README, "an answer's end means its
// call is tallied ... so a settle sent the moment an answer ends charges that call", and a Redis
// restart mid-run "loses no call that had ended". After a restart the tally has only the calls
// made since, and the row the calls it recorded, each call's record being written after its
// answer ended: a settle sent at once charged the larger of the two, not their sum, and the
// call's record then found its run settled. The run's row records the call before its end
// reaches the caller (tallyBeforeAnswer): here the second call's record is held at the run's
// row lock (as a busy database holds it for a moment), and the caller, the moment it has the
// answer's end, reads what the row records — the second call must be on it — and settles.
// (The second call costs more than the first, so the larger of the two records is the second
// call alone.)
func TestSettleAtAnAnswersEndAfterARedisRestartChargesThatCall(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-settle-at-end"}
	runID := firstRunCall(t, h, key, run, 5)
	ctx := context.Background()
	loseRunKeys(t, h, runID)

	second, tx, letGo := streamWithRunRowLocked(t, h, gate, key, run, runID)
	defer second.Body.Close()
	defer tx.Rollback()
	letGo()
	// The caller reads the answer as an SDK does, up to its last event, and settles the run
	// the moment it has it. What the row recorded then is read first, around the row's lock
	// (a consistent read does not wait for it).
	settled, sawEnd := make(chan string, 1), make(chan struct{})
	var callsAtEnd int
	var callsAtEndErr error
	go func() {
		sc := bufio.NewScanner(second.Body)
		for sc.Scan() && sc.Text() != "data: [DONE]" {
		}
		callsAtEndErr = h.db.Get(&callsAtEnd, "SELECT calls FROM run_holds WHERE run_id = ?", runID)
		close(sawEnd)
		resp := h.post(key, "/v1/runs/task-settle-at-end/settle", "", nil)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		settled <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	// The call's record waits for the row; its answer's end waits for the record.
	waitRunHoldsStatements(t, h, 1)
	if _, _, err := h.tally.Get(ctx, runID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	<-sawEnd
	if callsAtEndErr != nil || callsAtEnd != 2 {
		t.Fatalf("when the answer's end reached the caller the run's row recorded %d calls (%v), want 2: "+
			"the end went out before the call's record", callsAtEnd, callsAtEndErr)
	}
	if got := <-settled; !strings.HasPrefix(got, "200 ") {
		// Refused as busy (Redis lost calls of the run): settled again once that has passed.
		if !strings.HasPrefix(got, "409 ") || !strings.Contains(got, "run_busy") {
			t.Fatalf("settle at the answer's end: %s", got)
		}
		h.settled()
		if status, body := settleAfterRebuild(h, key, "task-settle-at-end", runID); status != http.StatusOK {
			t.Fatalf("settle: %d %s", status, body)
		}
	}
	second.Body.Close()
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.OutTok != 45 || r.Calls != 2 {
		t.Fatalf("run settled as %s with %d output tokens over %d calls, charged %d µUSD; want both calls (45 output tokens)",
			r.State, r.OutTok, r.Calls, r.ChargedMicro)
	}
}

// waitRunHoldsStatements waits until n statements on run_holds of this test's database are
// waiting (the test holds the row they need).
func waitRunHoldsStatements(t *testing.T, h *harness, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got int
		if err := h.db.Get(&got, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE ID <> CONNECTION_ID() AND DB = DATABASE() AND INFO LIKE '%run_holds%' AND INFO NOT LIKE '%PROCESSLIST%'`); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			var rows []struct {
				DB   *string `db:"DB"`
				Info *string `db:"INFO"`
			}
			_ = h.db.Select(&rows, "SELECT DB, INFO FROM information_schema.PROCESSLIST")
			for _, r := range rows {
				if r.DB != nil && r.Info != nil {
					t.Logf("%s: %s", *r.DB, *r.Info)
				}
			}
			t.Fatalf("%d statements on run_holds waiting, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSettleAfterARedisRestartWaitsForTheCallInFlight: README, "while a call of the run is in
// flight, POST …/settle gets 409 run_busy (its usage is not tallied yet)". A Redis restart
// without persistence loses the reservation of a call in flight (and its lease, until the next
// heartbeat): a settle sent then closed the run without that call, whose usage then found the
// run settled and was never charged.
func TestSettleAfterARedisRestartWaitsForTheCallInFlight(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-inflight"}
	runID := firstRunCall(t, h, key, run, 40)
	// An agent's run goes on for longer than the longest call.
	if _, err := h.db.Exec("UPDATE run_holds SET created_at = created_at - INTERVAL 1 DAY WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	// The second call stays mid-stream until the settle is answered (gateUpstream's held
	// stream): paced alone, its 30 events ended in 600 ms, on a loaded machine possibly before
	// the loss or the settle.
	second, letGo := h.heldStreamOK(t, gate, key, "second", slowStream(30, run))
	// The second call is in flight. Redis restarts without persistence.
	loseRunKeys(t, h, runID)
	busyUntilItsCallEnds(t, h, key, "task-inflight", runID, second, letGo, "while a call is in flight after a Redis restart")
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.OutTok != 70 || r.Calls != 2 {
		t.Fatalf("run settled with %d output tokens over %d calls, charged %d µUSD (%s); want both calls (70 output tokens): the call in flight during the settle is not charged",
			r.OutTok, r.Calls, r.ChargedMicro, r.SettleSource.String)
	}
}

// TestSettleAfterARedisRestartWhoseTallyCostsLessThanItsRowWaitsForTheCallInFlight: a Redis
// restart without persistence takes a named run's tally and the reservation of its call in
// flight, and the run's tally is written again by a call that ended since, whose record on
// the run's row never landed (retryRunCallEnd gave up): the tally counts as many calls as the
// row, and costs less. The loss shows in its cost alone, and the settle must wait for the
// call in flight (409 run_busy); read as a loss only of calls, the run was closed past that
// call, which then ended on a settled run, charged nothing.
func TestSettleAfterARedisRestartWhoseTallyCostsLessThanItsRowWaitsForTheCallInFlight(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	const name = "task-cheaper-tally"
	run := map[string]string{"X-Run-Id": name}
	runID := firstRunCall(t, h, key, run, 40)
	second, letGo := h.heldStreamOK(t, gate, key, "second", slowStream(30, run))
	loseRunKeys(t, h, runID)
	// The tally of the call that ended since the restart, unrecorded on the row: one call, as
	// the row has, costing less than the row's.
	cheap := fakeGPTCost(14, 1)
	if err := h.rdb.HSet(context.Background(), h.keys.Usage(runID), "calls", 1, "in_tok", 14, "out_tok", 1, "cost_micro", cheap).Err(); err != nil {
		t.Fatal(err)
	}
	// Read as it stands (h.run would wait for the call in flight's settlement).
	if r, err := h.store.Run(context.Background(), u.ID, runID); err != nil || r.Calls != 1 || r.CostMicro <= cheap {
		t.Fatalf("run's row %+v (%v): want its first call recorded, costing more than %d", r, err, cheap)
	}
	busyUntilItsCallEnds(t, h, key, name, runID, second, letGo,
		"with a call in flight after a Redis restart, its tally as many calls as its row and cheaper")
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 || r.OutTok != 70 {
		t.Fatalf("settled run %+v: want the first call and the one in flight (70 output tokens) charged", r)
	}
}

// busyUntilItsCallEnds settles the named run name while its call held is in flight after a
// Redis restart and requires 409 run_busy (what names the case: the settle must wait for that
// call); then it lets the call end, waits for its settlement, and settles the run
// (settleAfterRebuild), requiring 200.
func busyUntilItsCallEnds(t *testing.T, h *harness, key, name, runID string, held *http.Response, letGo func(), what string) {
	t.Helper()
	status, body := h.settleRun(key, name)
	letGo()
	readAll(t, held.Body)
	h.settled()
	if status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Errorf("settle %s: %d %s, want 409 run_busy", what, status, body)
	}
	if status, body := settleAfterRebuild(h, key, name, runID); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
}

// settleAfterRebuild settles a named run whose Redis record lost calls (a restart): the first
// settle is 409 run_busy until the lease TTL has passed since the loss was noticed, the time a
// call in flight has to be seen again; here that time is taken as passed.
func settleAfterRebuild(h *harness, key, name, runID string) (int, []byte) {
	h.t.Helper()
	status, body := h.settleRun(key, name)
	if status != http.StatusConflict || errorCode(h.t, body) != "run_busy" {
		return status, body
	}
	if err := h.rdb.Set(context.Background(), h.keys.Lost(runID), 0, time.Hour).Err(); err != nil {
		h.t.Fatal(err)
	}
	return h.settleRun(key, name)
}

// streamWithRunRowLocked starts a slow streamed call of the named run (run, its id runID) and,
// once it is admitted and streaming, locks the run's row, as a busy database would hold it for
// a moment: the call's record on the row waits until the caller commits or rolls back tx. The
// call is held mid-stream at gate (h a gatedHarness) until letGo: paced alone, its 40 events
// ended in 800 ms, and on a loaded machine before the lock was taken (or the test's step
// "during the call" made).
func streamWithRunRowLocked(t *testing.T, h *harness, gate *gateUpstream, key string, run map[string]string, runID string) (
	second *http.Response, tx *sqlx.Tx, letGo func()) {
	t.Helper()
	hdr, letGo := heldMidStream(t, gate, "second", slowStream(40, run))
	second = h.post(key, "/v1/chat/completions", streamBody, hdr)
	if second.StatusCode != http.StatusOK {
		second.Body.Close()
		t.Fatalf("second call: %d", second.StatusCode)
	}
	tx = testenv.ConsoleTx(t, h.db)
	var locked string
	if err := tx.Get(&locked, "SELECT run_id FROM run_holds WHERE run_id = ? FOR UPDATE", runID); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	return second, tx, letGo
}
