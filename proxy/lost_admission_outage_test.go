package proxy_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestLostAdmissionOutlastingSettleTimeoutChargedNothing: README "billing_unavailable": a call
// refused 503 whose hold the database may have committed is released at 0 "once it is back".
// Here the database commits the hold, the reply is lost, and it stays out of reach past the
// release's settle_timeout, so the release's first try fails; the database then comes back
// while the hold lives. The refused caller must be charged nothing: a call of its own (no
// Idempotency-Key) has a zero tally for that, and so must an Idempotency-Key call, whose
// attempt gets none (its run may be another request's) and relies on the release trying again.
func TestLostAdmissionOutlastingSettleTimeoutChargedNothing(t *testing.T) {
	for name, hdr := range map[string]map[string]string{
		"plain":           nil,
		"idempotency-key": {proxy.IdempotencyKeyHeader: "outage-" + testenv.RandomID(4)},
	} {
		t.Run(name, func(t *testing.T) {
			h, lossy, logs := newObservedLossyHarness(t, nil)
			u, key := h.user("standard")
			postRefusedWithCommitLost(t, h, lossy, key, hdr)
			// The release's try (settle_timeout) fails, the database still down; then it is back.
			awaitLog(t, logs, lossy, "lost admission not released", 30*time.Second)
			lossy.Restore()
			h.settled()
			reconcileAndWantUnchargedHold(t, h, u.ID)
		})
	}
}

// TestLostAdmissionReleaseThatGivesUpLeavesAZeroTally: when the database stays out of reach for
// the hold's whole life the release gives up, and the reconciler settles the expired hold from
// its tally: the zero tally written first for the fresh run id of a plain call is what keeps the
// refused caller from being charged what was held. Mutant: the zero tally skipped (`if ar.Fresh`
// -> `if false`); it survived, as the other tests let the release succeed once the database
// came back.
func TestLostAdmissionReleaseThatGivesUpLeavesAZeroTally(t *testing.T) {
	h, lossy, logs := newObservedLossyHarness(t, func(c *config.Config) {
		c.Holds.HoldTTL = 2 * time.Second // the release retries for this long
		c.Holds.HeartbeatInterval = time.Second
	})
	u, key := h.user("standard")
	postRefusedWithCommitLost(t, h, lossy, key, nil)
	awaitLog(t, logs, lossy, "lost admission not released; the reconciler will settle it", 60*time.Second)
	lossy.Restore()
	h.settled()
	reconcileAndWantUnchargedHold(t, h, u.ID)
}
