package proxy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// IdempotentRunID is the run id of attempt n of an Idempotency-Key.
var IdempotentRunID = idempotentRunID

// ReplayBuckets is how many time buckets a caller's count of stored answers splits replay_ttl
// into.
const ReplayBuckets = replayBuckets

// WaitSettlements waits, without closing anything, until no call is in flight and every
// settlement started so far has finished: tests go on calling after it.
func (s *Server) WaitSettlements(ctx context.Context) error {
	if err := s.calls.wait(ctx); err != nil {
		return err
	}
	return s.settlements.wait(ctx)
}

// ReleaseLostAdmission releases an admission whose outcome is unknown (err), as a refused call
// does; WaitSettlements waits for the release.
func (s *Server) ReleaseLostAdmission(ctx context.Context, ar holds.AdmitRequest, err error) {
	s.releaseLostAdmission(ctx, ar, err, s.log)
}

// TakeSettleSlots takes every background settlement slot, as a burst of settlements behind a
// slow database would, until the returned func gives them back.
func (s *Server) TakeSettleSlots() (giveBack func()) {
	n := cap(s.settleSlots)
	for range n {
		s.settleSlots <- struct{}{}
	}
	return func() {
		for range n {
			<-s.settleSlots
		}
	}
}

// CountKeyLookups counts, from now on, the key lookups the process's key cache answered (hits)
// and those that went to the store (misses): a test that relies on a key still being cached
// checks that it was, rather than inferring it from an outcome the store could give too.
func (s *Server) CountKeyLookups() (hits, misses *atomic.Int64) {
	hits, misses = new(atomic.Int64), new(atomic.Int64)
	f := func(hit bool) {
		if hit {
			hits.Add(1)
		} else {
			misses.Add(1)
		}
	}
	s.auth.observe.Store(&f)
	return hits, misses
}

// RunIDFor is the run id of a caller's named run (X-Run-Id).
var RunIDFor = runIDFor

// AdvanceIdemScriptSHA names the script that moves an Idempotency-Key past an attempt that did
// not pin it, as go-redis sends it (EVALSHA): a test loses that write by it.
var AdvanceIdemScriptSHA = advanceScript.Hash()

// ClaimForwardScriptSHA names the script a resumed Idempotency-Key attempt marks its key's
// record with before its forward: a test fails that write alone.
var ClaimForwardScriptSHA = claimForwardScript.Hash()

// SetAnswerMemoryWait sets how long a whole answer waits for room in max_response_memory
// before it is refused (answerMemoryWait).
func (s *Server) SetAnswerMemoryWait(d time.Duration) { s.answers.wait = d }

// NewTransport is the gateway's own upstream transport for limits l.
var NewTransport = newTransport

// Residue is what the process keeps for the calls in flight and its callers, by name: after a
// storm has ended and settled each must be back at its baseline (a leak shows as a count that
// does not come back).
func (s *Server) Residue() map[string]int {
	out := map[string]int{}
	s.bodies.mu.Lock()
	out["body_memory_callers"], out["body_memory_bytes"] = len(s.bodies.byCaller), int(s.bodies.total)
	s.bodies.mu.Unlock()
	s.answers.mu.Lock()
	out["answer_memory_callers"] = len(s.answers.callers)
	s.answers.mu.Unlock()
	s.counting.mu.Lock()
	out["token_counts_callers"] = len(s.counting.n)
	s.counting.mu.Unlock()
	s.cancels.mu.Lock()
	out["session_cancels"] = len(s.cancels.runs)
	s.cancels.mu.Unlock()
	s.calls.mu.Lock()
	out["calls"] = s.calls.n
	s.calls.mu.Unlock()
	s.settlements.mu.Lock()
	out["settlements"] = s.settlements.n
	s.settlements.mu.Unlock()
	out["settle_slots"] = len(s.settleSlots)
	out["leases"] = s.leases.Held()
	out["reservations_beaten"] = s.budgets.Beaten()
	return out
}

// CachedKeys is how many key lookups the key cache keeps.
func (s *Server) CachedKeys() int {
	s.auth.mu.Lock()
	defer s.auth.mu.Unlock()
	return len(s.auth.entries)
}

// ObserveSteps has f told of each store step on a call's path before forwarding (an
// admission, an Idempotency-Key attempt's row, a fingerprint's run, a session claim, a named
// run's reservation) as it
// starts, with the context it runs under and its name; f may take its time, as a slow step
// would, before the step runs.
func (s *Server) ObserveSteps(f func(ctx context.Context, step string)) { s.stepObserver.Store(&f) }

// SetUpstreamPing sets, for the transports built after it until t ends, how long an upstream
// connection may go without a frame before it is pinged, and how long the ping may go
// unanswered before the connection is dropped (upstreamPingAfter, upstreamPingTimeout).
func SetUpstreamPing(t testing.TB, after, timeout time.Duration) {
	prevAfter, prevTimeout := upstreamPingAfter, upstreamPingTimeout
	upstreamPingAfter, upstreamPingTimeout = after, timeout
	t.Cleanup(func() { upstreamPingAfter, upstreamPingTimeout = prevAfter, prevTimeout })
}

// CheckSessions runs one session check (checkSessions' tick) now, and returns how many runs it
// stopped.
func (s *Server) CheckSessions(ctx context.Context) (int, error) {
	return s.cancels.checkReplaced(ctx, s.store)
}

// SettlingCalls is how many of user's calls on this process are counted as settling: their
// answer over, their settlement not yet back from the database (settlingUsers).
func (s *Server) SettlingCalls(user uint64) int {
	s.settling.mu.Lock()
	defer s.settling.mu.Unlock()
	if e := s.settling.users[user]; e != nil {
		return e.n
	}
	return 0
}
