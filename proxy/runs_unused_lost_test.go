package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/proxy"
)

// newLossyRedisHarness is a harness whose Redis client (run budgets, leases, tally) goes through
// a lossy network, with the options the gateway gives its own (testenv.LossyRedisOptions:
// go-redis resends a lone command whose reply it lost). db, if set, is its database.
func newLossyRedisHarness(t *testing.T, db harnessSetup, mutate func(*config.Config)) (*harness, *testenv.LossyRedis) {
	t.Helper()
	lossy := testenv.NewLossyRedis(t)
	db.redisDialer, db.contextTimeouts = lossy.Dial, true
	return newHarnessOn(t, db, mutate), lossy
}

// TestNamedRunWithLostAdmissionWritesItsZeroTallyUntilItLands: a named run's first call is
// refused because its admission's commit went unanswered (the hold was committed), and the
// first write of the run's zero tally (proxy markRunUnused) fails. The gateway tries again
// until it lands: the run, which nobody comes back to, is then reconciled at 0, not charged
// its hold. The write lost before it reached Redis is the case that needs the retry; the one
// whose reply was lost (it landed) must be tried again harmlessly, and no failure counted.
// A try whose every attempt is lost (go-redis's own resends, MaxRetries, included) is landed by
// the gateway's own retry alone (markRunUnused's loop).
func TestNamedRunWithLostAdmissionWritesItsZeroTallyUntilItLands(t *testing.T) {
	for _, c := range []struct {
		name     string
		loss     testenv.RedisLoss
		wholeTry bool
	}{
		{"request lost", testenv.RedisRequestLost, false},
		{"reply lost", testenv.RedisReplyLost, false},
		{"every attempt of a try lost", testenv.RedisRequestLost, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dsn, lossyDB := testenv.LossyMySQLDSN(t)
			db := testenv.Open(t, dsn)
			h, lossy := newLossyRedisHarness(t, harnessSetup{db: db}, func(c *config.Config) {
				c.Limits.AdmitTimeout, c.Limits.SettleTimeout = time.Second, time.Second
			})
			u, key := h.user("standard")
			runID := proxy.RunIDFor(u.ID, "task-unused")
			// A script: go-redis resends it (MaxRetries), so one loss is landed by that resend;
			// a try whose every attempt is lost, only by markRunUnused's own loop.
			times := 1
			if c.wholeTry {
				times = h.rdb.Options().MaxRetries + 1
			}
			lossy.Arm(h.keys.Usage(runID), c.loss, times)
			postWithLostAdmission(h, lossyDB, key, map[string]string{"X-Run-Id": "task-unused"})
			h.settled()
			if lossy.Fired() != times {
				t.Fatalf("%d writes of the zero tally lost, want %d", lossy.Fired(), times)
			}
			if tl, found, err := h.tally.Get(context.Background(), runID); err != nil || !found || tl != (runstate.Tallied{}) {
				t.Fatalf("tally of the run: %+v found=%v err=%v; want the zero tally, landed on a later try", tl, found, err)
			}
			if got := h.metric("tollgate_tally_failures_total"); got != "0" {
				t.Fatalf("tally failures %q, want 0: the zero tally landed", got)
			}
			// The agent never comes back: the run expires and is reconciled (DESIGN §5).
			h.reconcileExpired(t, "run_id = ?", runID)
			if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.ChargedMicro != 0 {
				t.Fatalf("run whose admission was lost settled as %s, charged %d µUSD (source %s); want 0",
					r.State, r.ChargedMicro, r.SettleSource.String)
			}
		})
	}
}
