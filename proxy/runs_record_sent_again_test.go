package proxy_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestNamedRunCallRecordedOnceTheDatabaseIsBack: a Redis restart takes a named run's tally
// after its first call, so the run's row is the only record of that call, and the tally will be
// the only one of the calls after. The database then goes out of reach as the run's second
// call ends (at its final event: the call's record on the run's row is its next write), so
// that record reaches no database. Settled with the second call missing from its row, the run
// was charged the larger of the two records, the first call alone. The record is sent again in
// the background until it lands, the run's settle waiting for it meanwhile (its tally's
// record-to-come mark): once the database is back, the settle charges both calls, each once.
func TestNamedRunCallRecordedOnceTheDatabaseIsBack(t *testing.T) {
	dsn, lossyDB := testenv.LossyMySQLDSN(t)
	core, logs := observer.New(zap.InfoLevel)
	h := newHarnessOn(t, harnessSetup{db: testenv.Open(t, dsn), log: zap.New(core)}, func(c *config.Config) {
		c.Limits.SettleTimeout = 30 * time.Second // the tries outlast the outage
	})
	t.Cleanup(lossyDB.Restore) // before the harness's checks, if the test stops with it down
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-record-down"}
	runID := firstRunCall(t, h, key, run, 40)
	loseRunKeys(t, h, runID)

	callWithDatabaseDown(t, h, lossyDB, key, streamBody, run, "answer final")
	// Logged before the caller had the answer's end.
	if n := logs.FilterMessage(runCallNotRecordedLog).Len(); n != 1 {
		t.Fatalf("%d warnings of the record that failed, want 1: %v", n, logs.All())
	}
	lossyDB.Restore()
	h.settled() // the record's tries included
	if n := logs.FilterMessage("run call recorded on a later try").Len(); n != 1 {
		t.Fatalf("%d lines of the record landing on a later try, want 1: %v", n, logs.All())
	}

	if status, body := settleAfterRebuild(h, key, "task-record-down", runID); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.OutTok != 45 || r.Calls != 2 {
		t.Fatalf("settled run: %d output tokens over %d calls, charged %d; want both calls (45 output tokens) charged, once",
			r.OutTok, r.Calls, r.ChargedMicro)
	}
}

// runCallNotRecordedLog is what a gateway logs of a named run's call whose record on the run's
// row failed before the answer's end, once: it is sent again in the background.
const runCallNotRecordedLog = "run call not recorded; tried again until settle_timeout, counted once however often it lands"

// TestNamedRunCallRecordCutWhileSentIsSentAgain: as TestNamedRunCallRecordedOnceTheDatabaseIsBack,
// but the second call's record is sent, and then waits for the run's row, which another
// transaction holds (an operator's console, a long report), until the lock wait ends it and
// admit_timeout cuts it. Such a record may or may not have landed as far as the gateway can
// tell, and was never sent again, since a record whose statement had run counted the call
// twice sent again: with the run's Redis tally lost, its settle charged the first call alone
// (40 of the 45 output tokens). The row now counts a call once however often its record is
// sent, so it is sent again until it lands, once the row is free.
func TestNamedRunCallRecordCutWhileSentIsSentAgain(t *testing.T) {
	h, logs, userID, key, runID, console := callWithRecordCutByALock(t, "task-record-cut")
	if err := console.Commit(); err != nil {
		t.Fatal(err)
	}
	h.settled() // the record's tries included
	if n := logs.FilterMessage("run call recorded on a later try").Len(); n != 1 {
		t.Fatalf("%d lines of the record landing on a later try, want 1: %v", n, logs.All())
	}

	if status, body := settleAfterRebuild(h, key, "task-record-cut", runID); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(userID, runID); r.OutTok != 45 || r.Calls != 2 || r.EndedCalls != 2 {
		t.Fatalf("settled run: %d output tokens over %d calls (%d ended), charged %d; want both calls (45 output tokens) charged, once",
			r.OutTok, r.Calls, r.EndedCalls, r.ChargedMicro)
	}
}

// callWithRecordCutByALock makes a named run's first call (40 output tokens), takes the run's
// Redis keys as a restart would, and makes its second call (5) while another transaction
// (console, still open) holds the run's row from the second call's final event on: the call's
// record on the row waits for the lock until admit_timeout cuts it, and is then sent again in
// the background, until settle_timeout, as long as console holds the row.
func callWithRecordCutByALock(t *testing.T, name string) (h *harness, logs *observer.ObservedLogs, userID uint64, key, runID string, console *sqlx.Tx) {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"innodb_lock_wait_timeout": "1"}
	core, logs := observer.New(zap.InfoLevel)
	h = newHarnessOn(t, harnessSetup{db: testenv.Open(t, cfg.FormatDSN()), log: zap.New(core)}, func(c *config.Config) {
		c.Limits.AdmitTimeout = 1500 * time.Millisecond // the record's first send: past one lock wait
		c.Limits.SettleTimeout = 30 * time.Second       // the tries outlast the lock
	})
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": name}
	runID = firstRunCall(t, h, key, run, 40)
	loseRunKeys(t, h, runID)

	console = testenv.ConsoleTx(t, h.db)
	var locked sync.Once
	h.srv.ObserveSteps(func(_ context.Context, at string) {
		if at == "answer final" {
			locked.Do(func() {
				if _, err := console.Exec("SELECT run_id FROM run_holds WHERE run_id = ? FOR UPDATE", runID); err != nil {
					t.Error(err)
				}
			})
		}
	})
	h.postOK(t, key, "/v1/chat/completions", streamBody, with(run, fakellm.HeaderChunks, "5"))
	// Logged before the caller had the answer's end.
	if n := logs.FilterMessage(runCallNotRecordedLog).Len(); n != 1 {
		t.Fatalf("%d warnings of the record cut while it waited for the run's row, want 1: %v", n, logs.All())
	}
	return h, logs, u.ID, key, runID, console
}

// TestNamedRunSettledWhileItsCallsRecordIsCutIsBusy: as TestNamedRunCallRecordCutWhileSentIsSentAgain,
// but the run is settled while its second call's record still waits to be sent again (the
// row locked). The call's tally keeps a record-to-come mark until its record lands, and the
// settle is 409 run_busy meanwhile. A record whose failed first send dropped that mark as a
// landed one does let the settle through, to a run charged the larger of its row (the first
// call) and its tally since the restart (the second), not both — or, the row still locked,
// to a 503 that reopened it.
func TestNamedRunSettledWhileItsCallsRecordIsCutIsBusy(t *testing.T) {
	h, _, userID, key, runID, console := callWithRecordCutByALock(t, "task-record-cut-settled")
	status, body := settleAfterRebuild(h, key, "task-record-cut-settled", runID)
	if status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Fatalf("settle while the second call's record waits for the run's row: %d %s, want 409 run_busy", status, body)
	}
	if err := console.Commit(); err != nil {
		t.Fatal(err)
	}
	h.settled() // the record's tries included
	if status, body := settleAfterRebuild(h, key, "task-record-cut-settled", runID); status != http.StatusOK {
		t.Fatalf("settle once the record landed: %d %s", status, body)
	}
	if r := h.run(userID, runID); r.OutTok != 45 || r.Calls != 2 {
		t.Fatalf("settled run: %d output tokens over %d calls, charged %d; want both calls (45 output tokens) charged",
			r.OutTok, r.Calls, r.ChargedMicro)
	}
}

// runCallNeverRecordedLog is what a gateway logs of a named run's call whose record failed on
// every try until settle_timeout while its tally was written: the tally is then its one record.
const runCallNeverRecordedLog = "run call's record on its run's row failed on every try until settle_timeout; unless a try landed unanswered, its tally is its one record"

// TestNamedRunCallWhoseRecordNeverReachesTheDatabase: the database stays out of reach from a
// named run's call's admission until past settle_timeout, so the call's record on its row is
// never written. What the log then says is all an operator has to go on: with the call's tally
// written, one WARN, with the call's figures, that the tally is its one record (a Redis
// restart before the run settles would take the call from its charge); with its tally lost
// too, the ERROR that the call may be missing from its run's charge, and no WARN beside it.
func TestNamedRunCallWhoseRecordNeverReachesTheDatabase(t *testing.T) {
	for _, c := range []struct {
		name      string
		tallyLost bool
	}{
		{"tally written", false},
		{"tally lost", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, lossyDB, lossy, logs := newLossyStoresHarness(t)
			t.Cleanup(lossyDB.Restore)
			u, key := h.user("standard")
			run := map[string]string{"X-Run-Id": "task-record-never"}
			runID := firstRunCall(t, h, key, run, 5)
			if c.tallyLost {
				// The release script alone names the run's lost mark among a call's writes.
				lossy.Arm(h.keys.Lost(runID), testenv.RedisRequestLost, 1000)
			}
			// Down once the call is admitted (its reservation is in Redis, next): nothing of
			// the call but its record needs the database after.
			callWithDatabaseDown(t, h, lossyDB, key, chatBody, run, "run budget reservation")
			h.settled() // the tries, until settle_timeout, the database down throughout
			lossy.Disarm()
			lossyDB.Restore()

			never, missing := logs.FilterMessage(runCallNeverRecordedLog), logs.FilterMessage(runCallMaybeMissingLog)
			switch {
			case c.tallyLost && (missing.Len() != 1 || missing.All()[0].Level != zapcore.ErrorLevel || never.Len() != 0):
				t.Fatalf("tally lost too: want one ERROR saying the call may be missing and no WARN, got %v", logs.All())
			case !c.tallyLost && (never.Len() != 1 || never.All()[0].Level != zapcore.WarnLevel || missing.Len() != 0):
				t.Fatalf("tally written: want one WARN saying the tally is the call's one record, got %v", logs.All())
			}
			r := h.run(u.ID, runID)
			if r.Calls != 1 {
				t.Fatalf("the run's row records %d calls, want the first alone: the second's record never reached it", r.Calls)
			}
			line := never
			if c.tallyLost {
				line = missing
			}
			if got := line.All()[0].ContextMap()["cost_micro"]; got != fakeGPTCost(r.InTok, 5) {
				t.Errorf("the line names cost %v, want the call's %d", got, fakeGPTCost(r.InTok, 5))
			}
		})
	}
}

// callWithDatabaseDown makes a call of the named run in hdr, answering 5 output tokens, whose
// database (through lossyDB) goes out of reach at its step step, and requires it answered 200.
func callWithDatabaseDown(t *testing.T, h *harness, lossyDB *testenv.Lossy, key, body string, hdr map[string]string, step string) {
	t.Helper()
	var down sync.Once
	h.srv.ObserveSteps(func(_ context.Context, at string) {
		if at == step {
			down.Do(lossyDB.TakeDown)
		}
	})
	resp := h.post(key, "/v1/chat/completions", body, with(hdr, fakellm.HeaderChunks, "5"))
	readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !lossyDB.Down() {
		t.Fatalf("call: %d, database out of reach %v; want 200 with the database taken down at its step %q",
			resp.StatusCode, lossyDB.Down(), step)
	}
}
