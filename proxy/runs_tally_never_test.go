package proxy_test

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The log lines of a named run's call whose tally writes fail (proxy tallyFailed,
// runTallyGivenUp): what an operator reads decides whether they go looking for lost money.
const (
	runTallyFailedLog      = "run tally write failed; tried again until settle_timeout, the run's row records the call"
	runTallyNeverLog       = "run tally never written; the run's row records the call"
	runCallMaybeMissingLog = "run call may be missing from its run's charge: its tally was never written and its row's record failed"
)

// TestNamedRunCallWhoseTallyNeverLands: every write of a named run's call to its run's tally is
// lost on its way to Redis, for longer than settle_timeout. The run is charged the larger of
// its tally and its row's record, and the row records every call that ended, so nothing is
// lost: the call's failure is one warning, not one per try (a Redis out of reach for a minute
// logged dozens of ERROR lines per call, each saying the call was missing from its run's
// charge, which it was not), and the give-up says the row has the call. So it does when the
// row's record lost its reply too: the record is sent again and counted once, where it was
// left at "may or may not have landed" and the call said to be possibly missing. (A record
// that never lands: TestNamedRunCallWhoseRecordNeverReachesTheDatabase.)
func TestNamedRunCallWhoseTallyNeverLands(t *testing.T) {
	for _, c := range []struct {
		name            string
		recordReplyLost bool
	}{
		{"record lands", false},
		{"record's reply lost", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, lossyDB, lossy, logs := newLossyStoresHarness(t)
			u, key := h.user("standard")
			run := map[string]string{"X-Run-Id": "task-tally-never"}
			runID := firstRunCall(t, h, key, run, 5)
			// The release script alone names the run's lost mark among a call's writes: every
			// try of the second call's tally, and each of go-redis's resends, is lost.
			lossy.Arm(h.keys.Lost(runID), testenv.RedisRequestLost, 1000)
			if c.recordReplyLost {
				lossyDB.Arm("INSERT INTO run_calls", testenv.LoseReply) // RecordRunCall alone
			}
			// second call
			h.postOK(t, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "5"))
			h.settled() // the tally's retries included, until settle_timeout
			lossy.Disarm()
			if tries := lossy.Fired() / (h.rdb.Options().MaxRetries + 1); tries < 3 {
				t.Fatalf("%d tally writes lost, want the call's tries and retries (at least 3)", tries)
			}
			if c.recordReplyLost && !lossyDB.Fired() {
				t.Fatal("the reply to the call's record on its run's row was not lost")
			}

			if n := logs.FilterMessage(runTallyFailedLog).Len(); n != 1 {
				t.Errorf("%d warnings of the failed tally, want 1 (logs %v)", n, logs.All())
			}
			never, missing := logs.FilterMessage(runTallyNeverLog), logs.FilterMessage(runCallMaybeMissingLog)
			if never.Len() != 1 || never.All()[0].Level != zapcore.WarnLevel || missing.Len() != 0 {
				t.Errorf("want one WARN saying the row has the call, got %v", logs.All())
			}
			if n := logs.FilterLevelExact(zapcore.ErrorLevel).Len(); n != 0 {
				t.Errorf("%d ERROR lines with nothing missing: %v", n, logs.FilterLevelExact(zapcore.ErrorLevel).All())
			}

			// The row recorded both calls, each once, which is what settling the run charges
			// (the call's reservation, never given back, keeps a settle at run_busy until the
			// lease TTL lapses).
			if r := h.run(u.ID, runID); r.Calls != 2 || r.EndedCalls != 2 || r.CostMicro != 2*fakeGPTCost(r.InTok/2, 5) {
				t.Fatalf("run %+v: want its row to record both calls, each once", r)
			}
		})
	}
}

// newLossyStoresHarness is a harness whose database and Redis each go through a lossy network,
// whose log lines (Info and up) are observed, and whose settle_timeout, 1 s, bounds the tries
// of a named run's call's end that failed.
func newLossyStoresHarness(t *testing.T) (*harness, *testenv.Lossy, *testenv.LossyRedis, *observer.ObservedLogs) {
	t.Helper()
	dsn, lossyDB := testenv.LossyMySQLDSN(t)
	core, logs := observer.New(zap.InfoLevel)
	h, lossy := newLossyRedisHarness(t, harnessSetup{db: testenv.Open(t, dsn), log: zap.New(core)}, func(c *config.Config) {
		c.Limits.SettleTimeout = time.Second
	})
	return h, lossyDB, lossy, logs
}
