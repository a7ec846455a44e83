package proxy_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestNamedRunCallRecordedOnceTheDatabaseIsBack: a Redis restart takes a named run's tally
// after its first call, so the run's row is the only record of that call, and the tally will be
// the only one of the calls after. The database then goes out of reach as the run's second
// call ends (at its final event: the call's record on the run's row is its next write), so
// that record reaches no database. Settled with the second call missing from its row, the run
// was charged the larger of the two records, the first call alone. A record that reached no
// database cannot count the call twice, so it is sent again in the background until it lands,
// the run's settle waiting for it meanwhile (its tally's record-to-come mark): once the
// database is back, the settle charges both calls, each once.
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

	var down sync.Once
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "answer final" {
			down.Do(lossyDB.TakeDown)
		}
	})
	second := h.post(key, "/v1/chat/completions", streamBody, with(run, fakellm.HeaderChunks, "5"))
	readAll(t, second.Body)
	second.Body.Close()
	if second.StatusCode != http.StatusOK || !lossyDB.Down() {
		t.Fatalf("second call: %d, database out of reach %v; want 200 with the database taken down at its final event",
			second.StatusCode, lossyDB.Down())
	}
	// Logged before the caller had the answer's end.
	if n := logs.FilterMessage("run call not recorded, the database out of reach; tried again until settle_timeout").Len(); n != 1 {
		t.Fatalf("%d warnings of the record that reached no database, want 1: %v", n, logs.All())
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
