package proxy_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// lateReadTimeout is how long the gateway's Redis client waits for a reply in these tests: a
// write held late (testenv.RedisWriteLate) costs that, and go-redis then resends a lone command
// on a new connection, or fails a MULTI/EXEC, as it does in production past its read timeout.
const lateReadTimeout = 250 * time.Millisecond

// newLateRedisHarness is newLossyRedisHarness whose Redis client gives up on a reply after
// lateReadTimeout.
func newLateRedisHarness(t *testing.T, setup harnessSetup, mutate func(*config.Config)) (*harness, *testenv.LossyRedis) {
	t.Helper()
	lossy := testenv.NewLossyRedis(t)
	setup.redisDialer, setup.contextTimeouts, setup.redisReadTimeout = lossy.Dial, true, lateReadTimeout
	return newHarnessOn(t, setup, mutate), lossy
}

// deliverAllLate disarms lossy and delivers, in the order they were held, every write it held
// late: each runs in Redis after whatever the gateway did since. It returns how many.
func deliverAllLate(t *testing.T, lossy *testenv.LossyRedis) int {
	t.Helper()
	lossy.Disarm()
	n := lossy.Fired()
	if n == 0 {
		t.Fatal("no write was held late: the marker matches nothing")
	}
	for range n {
		lossy.AwaitLate().Deliver()
	}
	return n
}

// runCall makes one call of the caller-named run name; it must be answered 200.
func runCall(t *testing.T, h *harness, key, name string) {
	t.Helper()
	h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": name, fakellm.HeaderChunks: "5"})
}

// TestNamedRunCloseDeliveredLateAfterItsSettleFailedLeavesTheRunOpen: a settle's close of the
// run (CloseRun) reaches Redis only after the gateway gave up on it: the settle is answered 503
// and the run reopened with the close's mark, a reopen that finds nothing to undo. README: "a
// settle that fails (503, nothing charged) leaves the run open again". The close then lands and
// must not close the run: closed, its next calls were refused 409 run_settled, with nothing
// settled, for the longest a call may live, and no one left to reopen it.
func TestNamedRunCloseDeliveredLateAfterItsSettleFailedLeavesTheRunOpen(t *testing.T) {
	h, lossy := newLateRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	runCall(t, h, key, "task-late-close")
	h.settled()
	runID := proxy.RunIDFor(u.ID, "task-late-close")
	// Nothing of the run is in flight: its close alone names its lease.
	lossy.Arm(h.keys.Lease(runID), testenv.RedisWriteLate, h.rdb.Options().MaxRetries+1)
	if status, body := h.settleRun(key, "task-late-close"); status != http.StatusServiceUnavailable {
		t.Fatalf("settle whose close never reached Redis in time: %d %s, want 503", status, body)
	}
	deliverAllLate(t, lossy)
	runCall(t, h, key, "task-late-close")
	h.settled()
	if status, body := h.settleRun(key, "task-late-close"); status != http.StatusOK {
		t.Fatalf("settle retried: %d %s, want 200", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 || r.ChargedMicro != 2*fakeGPTCost(r.InTok/2, 5) {
		t.Fatalf("run %+v: want settled with its two calls charged once each", r)
	}
}

// TestNamedRunReservationDeliveredLateAfterItsCallEndedHoldsNothing: a call's reservation of
// the run's budget reaches Redis late; go-redis resends it on a new connection, which lands, and
// the call runs and ends (its usage tallied, its reservation given back). The late reservation
// then lands, for a call that has ended and that no process stamps: it must reserve nothing.
// Reserved, the run counted a call in flight for lease_ttl: its settle was refused 409 run_busy
// with nothing running (README: run_busy "while a call of the run is in flight"), and its next
// calls found that much less of the cap.
func TestNamedRunReservationDeliveredLateAfterItsCallEndedHoldsNothing(t *testing.T) {
	for _, c := range []struct {
		name  string
		times int // the reservation's attempts held late
	}{
		{"resent and landed", 1},
		{"every attempt late, the call refused", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, lossy := newLateRedisHarness(t, harnessSetup{}, nil)
			u, key := h.user("standard")
			runCall(t, h, key, "task-late-reserve")
			h.settled()
			runID := proxy.RunIDFor(u.ID, "task-late-reserve")
			times := c.times
			if times == 0 {
				times = h.rdb.Options().MaxRetries + 1
			}
			// The call's first write naming the run's budget is its reservation.
			lossy.Arm(h.keys.RunBudget(runID), testenv.RedisWriteLate, times)
			resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-late-reserve", fakellm.HeaderChunks: "5"})
			body := readAll(t, resp.Body)
			resp.Body.Close()
			wantStatus := http.StatusOK
			if c.times == 0 {
				wantStatus = http.StatusServiceUnavailable
			}
			if resp.StatusCode != wantStatus {
				t.Fatalf("call whose reservation was late: %d %s, want %d", resp.StatusCode, body, wantStatus)
			}
			h.settled()
			deliverAllLate(t, lossy)
			if status, body := h.settleRun(key, "task-late-reserve"); status != http.StatusOK {
				t.Fatalf("settle with no call in flight: %d %s, want 200", status, body)
			}
			calls := 1
			if c.times == 1 {
				calls = 2
			}
			if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != calls || r.ChargedMicro != int64(calls)*fakeGPTCost(r.InTok/int64(calls), 5) {
				t.Fatalf("run %+v: want settled with its %d answered calls charged once each", r, calls)
			}
		})
	}
}
