package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestNamedRunCallWhoseReservationRepliesWereLostGivesItBack: a named run's call reserves its
// share of the run's budget; Redis makes the reservation and every reply, go-redis's resends
// included, is lost. The call is refused 503, and its reservation, which it cannot know was
// made, is given back all the same (proxy reserveRunBudget: the call counts as reserving on
// any error): the run can be settled at once, and is charged nothing. Kept, the reservation is
// beaten by this process for as long as it lives, and every settle of the run is refused 409
// run_busy with nothing in flight.
func TestNamedRunCallWhoseReservationRepliesWereLostGivesItBack(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	// Another run's call loads the reservation and release scripts into Redis, as any running
	// gateway has them: the reservation goes as one EVALSHA, and runs.
	firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-warm"}, 5)
	runID := proxy.RunIDFor(u.ID, "task-reserve-lost")
	attempts := h.rdb.Options().MaxRetries + 1
	// The reservation is the call's first write naming the run's budget hash.
	lossy.Arm(h.keys.RunBudget(runID), testenv.RedisReplyLost, attempts)
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-reserve-lost"})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if lossy.Fired() != attempts {
		t.Fatalf("%d replies of the reservation lost, want every attempt's, %d", lossy.Fired(), attempts)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("call whose reservation replies were all lost: %d %s, want 503", resp.StatusCode, body)
	}
	if h.fake.Calls() != 1 {
		t.Fatalf("%d upstream calls, want the warm-up's alone", h.fake.Calls())
	}
	h.settled()
	if status, body := h.settleRun(key, "task-reserve-lost"); status != http.StatusOK {
		t.Fatalf("settle of the run whose only call was refused: %d %s, want 200", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.ChargedMicro != 0 {
		t.Fatalf("run %+v: want settled at 0", r)
	}
}

// TestNamedRunCallWhoseReservationReplyWasLostIsServed: Redis makes a call's reservation and
// its reply is lost; go-redis sends the script again, as the gateway's client does. The resend
// finds the call's own reservation and returns its grant (runstate.RunBudget.ReserveAtMost):
// the call is served and its run settles with it. Reserving afresh, the resend counted the
// call's first reservation against it and refused the call for a run it alone was using.
func TestNamedRunCallWhoseReservationReplyWasLostIsServed(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-warm"}, 5)
	runID := proxy.RunIDFor(u.ID, "task-reserve-resent")
	lossy.Arm(h.keys.RunBudget(runID), testenv.RedisReplyLost, 1)
	resp := h.post(key, "/v1/chat/completions", chatBody, with(map[string]string{"X-Run-Id": "task-reserve-resent"}, fakellm.HeaderChunks, "5"))
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if lossy.Fired() != 1 {
		t.Fatalf("%d replies of the reservation lost, want 1", lossy.Fired())
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call whose reservation was resent: %d %s, want 200", resp.StatusCode, body)
	}
	h.settled()
	if status, body := h.settleRun(key, "task-reserve-resent"); status != http.StatusOK {
		t.Fatalf("settle: %d %s, want 200", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 1 || r.ChargedMicro != fakeGPTCost(r.InTok, 5) {
		t.Fatalf("run %+v: want settled with its one call charged", r)
	}
}
