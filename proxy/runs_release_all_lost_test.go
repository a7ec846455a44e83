package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestNamedRunCallWhoseReleaseRepliesWereAllLost: a named run's call tallies and gives back its
// reservation in one script (RunBudget.ReleaseBeforeRecord) before its answer ends; Redis runs
// it and every reply, go-redis's resends included, is lost. The call cannot know it landed: it
// tries again when it ends (finishRunCall), and that repeat finds the call tallied (its done
// mark) and tallies nothing. The run's tally has the call once, and a settle sent after the
// call settles at once — on a run whose Redis record lost calls too, where the first run of the
// script marked the call's record as still to come: the call's record has landed on the row by
// then, and the mark, unknown to the call, must not keep the settle at 409 run_busy until it
// lapses (the lease TTL) with nothing in flight.
func TestNamedRunCallWhoseReleaseRepliesWereAllLost(t *testing.T) {
	for _, c := range []struct {
		name       string
		recordLost bool // a Redis restart lost the run's keys before the call
	}{
		{"record whole", false},
		{"record lost", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			h, lossy := newLossyRedisHarness(t, harnessSetup{log: zap.New(core)}, nil)
			u, key := h.user("standard")
			run := map[string]string{"X-Run-Id": "task-release-all-lost"}
			// The first call also loads the release script into Redis: the second's goes as
			// EVALSHA, and runs.
			runID := firstRunCall(t, h, key, run, 5)
			// Its tally landed at the first try (before its answer ended): nothing to say.
			if n := logs.FilterMessage("run tally written on a later try").Len(); n != 0 {
				t.Fatalf("a call tallied at the first try logged %d later-try landings", n)
			}
			wantTally := int64(2)
			if c.recordLost {
				loseRunKeys(t, h, runID)
				// The restart was noticed lease_ttl ago: a settle no longer waits for the rebuild.
				if err := h.rdb.Set(context.Background(), h.keys.Lost(runID), 0, time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
				wantTally = 1
			}
			attempts := h.rdb.Options().MaxRetries + 1
			// The release script alone names the run's lost mark among a call's writes (the
			// reservation names the call's done mark too).
			lossy.Arm(h.keys.Lost(runID), testenv.RedisReplyLost, attempts)
			h.postOK(t, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "5")) // call whose release replies were lost
			h.settled()
			if lossy.Fired() != attempts {
				t.Fatalf("%d release replies lost, want every attempt's, %d", lossy.Fired(), attempts)
			}
			row := h.run(u.ID, runID)
			tl, found, err := h.tally.Get(context.Background(), runID)
			if err != nil || !found || tl.Calls != wantTally || row.Calls != 2 {
				t.Fatalf("tally %+v (found %v, %v), row %d calls: want the second call tallied once", tl, found, err, row.Calls)
			}
			// The failed tries logged the failure; the try that landed must say so, or the
			// operator reads a loss that did not happen.
			if logs.FilterMessage(runTallyFailedLog).Len() == 0 ||
				logs.FilterMessage("run tally written on a later try").Len() != 1 {
				t.Fatalf("logs %v: want the failed tally and then the one that landed", logs.All())
			}
			if status, body := h.settleRun(key, "task-release-all-lost"); status != http.StatusOK {
				t.Fatalf("settle after the run's calls ended: %d %s, want 200", status, body)
			}
			if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 || r.ChargedMicro != 2*fakeGPTCost(r.InTok/2, 5) {
				t.Fatalf("run %+v: want settled with both calls charged once", r)
			}
		})
	}
}

// TestNamedRunCallWhoseRecordMarkSurvivesAFailedLaterTry: as the "record lost" case above,
// the call's ReleaseBeforeRecord runs in Redis and every reply is lost, leaving its record's
// still-to-come mark unknown to the call; then its tally's next try (finishRunCall's Release)
// does not reach Redis at all, and only the try after that (retryRunCallEnd) lands. The mark must
// be dropped once a try has landed, not at a try that failed: dropped then (in a Redis that
// is not answering) the drop was lost and never tried again, and every settle of the run was
// refused 409 run_busy with nothing in flight until the mark lapsed. (Mutant: the drop tied to
// recordMarkUnknown alone, not to the Release having landed.)
func TestNamedRunCallWhoseRecordMarkSurvivesAFailedLaterTry(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-mark-later-try"}
	runID := firstRunCallThenLoseItsRecord(t, h, key, run)
	attempts := h.rdb.Options().MaxRetries + 1
	// Every attempt of ReleaseBeforeRecord runs, its reply lost; then the next two commands
	// naming the run's budget (the Release's tries, or a Release and a mark drop) are lost on
	// the way, every attempt of each.
	lossy.Arm(h.keys.Lost(runID), testenv.RedisReplyLost, attempts)
	lossy.ArmThen(h.keys.RunBudget(runID), testenv.RedisRequestLost, 2*attempts)
	secondCallThenSettle(t, h, lossy, u.ID, key, run, runID, 3*attempts)
}

// TestNamedRunCallWhoseRecordMarkDropFailedIsSettledOnceRedisAnswers: on a run whose Redis
// record lost calls, a call's tally marks its record on the run's row as still to come, and the
// call drops the mark once the record has landed (RunBudget.Recorded). Here that drop is lost,
// every attempt of it, while the tally and the record land. The call is answered; once its end
// has been dealt with (WaitSettlements), a settle must go through at once. Without a later try
// of the drop the mark kept every settle at 409 run_busy, nothing in flight, until it lapsed
// (the lease TTL): the flake of TestStormBehindARedisSlowerThanItsBoundsFailsClosed.
func TestNamedRunCallWhoseRecordMarkDropFailedIsSettledOnceRedisAnswers(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	h, lossy := newLossyRedisHarness(t, harnessSetup{log: zap.New(core)}, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-mark-drop-lost"}
	runID := firstRunCallThenLoseItsRecord(t, h, key, run)
	// The drop's script, as go-redis sends it first (EVALSHA): every attempt is cut before it
	// reaches Redis, so the call cannot fall back to EVAL and the drop fails.
	attempts := h.rdb.Options().MaxRetries + 1
	lossy.Arm(recordedScriptSHA, testenv.RedisRequestLost, attempts)
	secondCallThenSettle(t, h, lossy, u.ID, key, run, runID, attempts)
	if logs.FilterMessage("run call's record marked on a later try").Len() != 1 {
		t.Fatalf("logs %v: want the drop that landed on a later try said so", logs.All())
	}
}

// TestNamedRunCallWhoseRecordMarkDropFailsAgainIsSettledOnceRedisAnswers: as
// TestNamedRunCallWhoseRecordMarkDropFailedIsSettledOnceRedisAnswers, but the drop's first
// later try is lost too, every attempt of it, while the tally and the record have landed. The
// call's end keeps trying the drop (retryRunCallEnd) until it lands, not only once: stopping
// once the tally and the record were in kept the run's settle at 409 run_busy until the mark
// lapsed.
func TestNamedRunCallWhoseRecordMarkDropFailsAgainIsSettledOnceRedisAnswers(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	h, lossy := newLossyRedisHarness(t, harnessSetup{log: zap.New(core)}, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-mark-drop-lost-again"}
	runID := firstRunCallThenLoseItsRecord(t, h, key, run)
	// Every attempt of the drop at the call's end and of its first later try.
	attempts := 2 * (h.rdb.Options().MaxRetries + 1)
	lossy.Arm(recordedScriptSHA, testenv.RedisRequestLost, attempts)
	secondCallThenSettle(t, h, lossy, u.ID, key, run, runID, attempts)
	if logs.FilterMessage("run call's record marked on a later try").Len() != 1 {
		t.Fatalf("logs %v: want the drop that landed on a later try said so", logs.All())
	}
}

// recordedScriptSHA is the SHA go-redis names runstate's record-mark drop by (EVALSHA). A
// change to that script's source leaves the marker matching nothing, which the test's count of
// lost drops reports.
var recordedScriptSHA = redis.NewScript(`return redis.call('HDEL', KEYS[1], 'r:' .. ARGV[1])`).Hash()

// firstRunCallThenLoseItsRecord makes a named run's first call, then loses the run's Redis
// record as a restart would, noticed lease_ttl ago (a settle no longer waits for the rebuild):
// the run's next call's tally marks its record on the row as still to come.
func firstRunCallThenLoseItsRecord(t *testing.T, h *harness, key string, run map[string]string) string {
	t.Helper()
	runID := firstRunCall(t, h, key, run, 5)
	loseRunKeys(t, h, runID)
	if err := h.rdb.Set(context.Background(), h.keys.Lost(runID), 0, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	return runID
}

// secondCallThenSettle makes the run's second call under the losses lossy is armed with, which
// must all fire (lost), waits for its end to be dealt with, and requires the run's settle to go
// through at once, charging both calls once.
func secondCallThenSettle(t *testing.T, h *harness, lossy *testenv.LossyRedis, userID uint64, key string, run map[string]string, runID string, lost int) {
	t.Helper()
	h.postOK(t, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "5")) // second call under lost writes
	h.settled()
	if lossy.Fired() != lost {
		t.Fatalf("%d writes lost, want %d", lossy.Fired(), lost)
	}
	if status, body := h.settleRun(key, run["X-Run-Id"]); status != http.StatusOK {
		t.Fatalf("settle after the run's calls ended: %d %s, want 200", status, body)
	}
	if r := h.run(userID, runID); r.State != holds.StateSettled || r.Calls != 2 || r.ChargedMicro != 2*fakeGPTCost(r.InTok/2, 5) {
		t.Fatalf("run %+v: want settled with both calls charged once", r)
	}
}
