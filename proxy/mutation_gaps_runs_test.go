package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestNamedRunEmbeddingsCallReservesOnlyItsPrompt: an embeddings call has no output, so its
// share of its run's cap is its prompt's cost, not all the run has left. Reserved as a call
// with no output bound, it left nothing for the run's other calls while it ran: a chat call
// of the same run beside it was refused 402 run_budget_exhausted with the run all but unused.
func TestNamedRunEmbeddingsCallReservesOnlyItsPrompt(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	allowance, inFlight := int64(30_000), 8
	if err := h.store.SetUserLimits(context.Background(), u.ID, &allowance, &inFlight, nil); err != nil {
		t.Fatal(err)
	}
	defer gate.open("embed")
	embedded := make(chan *http.Response, 1)
	go func() {
		embedded <- h.post(key, "/v1/embeddings", `{"model":"fake-gpt","input":"a short text"}`,
			map[string]string{"X-Run-Id": "task-embed", "X-Test-Gate": "embed"})
	}()
	gate.await(t, "embed", 1)
	// a chat call beside the run's embeddings call in flight: the embeddings call holds only its prompt
	h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":100,"messages":[{"role":"user","content":"beside it"}]}`,
		map[string]string{"X-Run-Id": "task-embed"})
	gate.open("embed")
	first := <-embedded
	b := readAll(t, first.Body)
	first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("the embeddings call: %d %s", first.StatusCode, b)
	}
}

// TestNamedRunCallReservingAfterItsRunClosedIsRunSettled: a call of a named run admitted
// before its run's settle closed the run reaches its reservation after: it is refused 409
// run_settled, as a call of a settled run is, not 402 run_budget_exhausted, which would tell
// the agent its run ran out of budget and send it looking for more.
func TestNamedRunCallReservingAfterItsRunClosedIsRunSettled(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	h.endedRunCall(t, key, "task-closing")
	reached, resume := h.holdAtFirst("run budget reservation")
	late := make(chan *http.Response, 1)
	go func() {
		late <- h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-closing"})
	}()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the run's second call never reached its reservation")
	}
	if status, body := h.settleRun(key, "task-closing"); status != http.StatusOK {
		t.Fatalf("settle with a call admitted but not yet reserving: %d %s, want 200", status, body)
	}
	resume()
	resp := <-late
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || errorCode(t, body) != "run_settled" {
		t.Fatalf("a call reserving on a run closed for its settlement: %d %s, want 409 run_settled", resp.StatusCode, body)
	}
}

// TestSettleThatChargedNothingReopensTheRun: a settle on request closes its run in Redis and
// then finds the database gone before its settlement wrote anything: answered 503 "the run was
// not settled", it must reopen the run. Left closed, the run's next call was refused 409
// run_settled for a run that was never settled, until the close's mark lapsed.
func TestSettleThatChargedNothingReopensTheRun(t *testing.T) {
	h, lossy := newLossyHarness(t)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-reopened"}
	runID := firstRunCall(t, h, key, run, 5)
	// The settlement's first statement, before its transaction: the read of its run's user.
	lossy.Arm("SELECT run_id, user_id FROM run_holds WHERE run_id IN", testenv.GoDown)
	status, body := h.settleRun(key, "task-reopened")
	down := lossy.Down()
	lossy.Restore()
	if !down {
		t.Fatalf("the settlement never lost the database: settle answered %d %s", status, body)
	}
	if status != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" ||
		!strings.Contains(errorMessage(t, body), "was not settled") {
		t.Fatalf("settle whose settlement wrote nothing: %d %s, want 503 saying the run was not settled", status, body)
	}
	h.postOK(t, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "5")) // the run's next call after a settle that charged nothing: the run reopened
	h.settled()
	settledOnRetry(t, h, key, "task-reopened")
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 {
		t.Fatalf("run %+v: want settled with both its calls", r)
	}
}

// TestOpenRunWithAnImpossibleTallyShowsWhatItsRowRecorded: GET /v1/runs/{id} of an open named
// run reads its tally as its settlement would: a negative figure in it (a hand edit, a
// correction whose tally was lost) is no record, and the run shows what its row recorded of
// its calls — not a negative token count that its settlement would never charge.
func TestOpenRunWithAnImpossibleTallyShowsWhatItsRowRecorded(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	runID := h.endedRunCall(t, key, "task-negative-view")
	recorded := h.run(u.ID, runID)
	if recorded.InTok <= 0 || recorded.Calls != 1 {
		t.Fatalf("the call's record on the run's row: %d input tokens, %d calls; want some, 1 call", recorded.InTok, recorded.Calls)
	}
	if err := h.rdb.HSet(context.Background(), h.keys.Usage(runID), "in_tok", -5).Err(); err != nil {
		t.Fatal(err)
	}
	status, view := h.get(key, "/v1/runs/task-negative-view")
	usage, _ := view["usage"].(map[string]any)
	if status != http.StatusOK || usage == nil || usage["input"] != float64(recorded.InTok) {
		t.Fatalf("view of an open run whose tally is impossible: %d %v; want its row's %d input tokens", status, view, recorded.InTok)
	}
}

// TestSettleWhoseTallyReadAfterTheCloseFailsReopensTheRun: a settle on request closes its run in
// Redis and then reads the run's tally, what it charges. When that read fails (every attempt
// lost on the way to Redis), the settle charged nothing and knows it: it answers 503
// billing_unavailable saying the run was not settled, and reopens the run. Not 409 run_busy:
// no call of the run is in flight, and an agent told so would wait for one that never ends.
// Left closed, the run's next call was refused 409 run_settled for a run nobody had settled.
func TestSettleWhoseTallyReadAfterTheCloseFailsReopensTheRun(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-tally-unread"}
	runID := firstRunCall(t, h, key, run, 5)
	attempts := h.rdb.Options().MaxRetries + 1
	var armed atomic.Bool
	armed.Store(true)
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "run close" && armed.CompareAndSwap(true, false) {
			// Armed once the tally's first read is done: of the settle's writes from here on only
			// the tally's read names a tally's price_snapshot field (the close's script does not).
			lossy.Arm("price_snapshot", testenv.RedisRequestLost, attempts)
		}
	})
	status, body := h.settleRun(key, "task-tally-unread")
	if fired := lossy.Fired(); fired != attempts {
		t.Fatalf("%d attempts of the tally's read after the close lost, want every one, %d (settle answered %d %s)", fired, attempts, status, body)
	}
	if status != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" ||
		!strings.Contains(errorMessage(t, body), "was not settled") {
		t.Fatalf("settle whose tally read after the close failed: %d %s, want 503 billing_unavailable saying the run was not settled", status, body)
	}
	if r := h.run(u.ID, runID); r.State == holds.StateSettled || r.ChargedMicro != 0 {
		t.Fatalf("run %+v after a settle that charged nothing: want it open, nothing charged", r)
	}
	h.postOK(t, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "5")) // the run's next call: the settle reopened it
	h.settled()
	settledOnRetry(t, h, key, "task-tally-unread")
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 {
		t.Fatalf("run %+v: want settled with both its calls", r)
	}
}

// TestNamedRunSettledFromItsTallyWhenItCostsMoreThanItsRowRecordingMoreCalls: README: a
// settlement takes whichever of the run's Redis tally and its row's record cost more. A Redis
// restart lost two ended calls from the tally (the row records them), and a dearer call ended
// since, its record on the row never landed: the row records more calls, the tally costs
// more. The run is charged the tally's cost; taken for recording more, the row charged it
// less than its calls cost.
func TestNamedRunSettledFromItsTallyWhenItCostsMoreThanItsRowRecordingMoreCalls(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const name = "task-dearer-tally"
	run := map[string]string{"X-Run-Id": name}
	runID := firstRunCall(t, h, key, run, 5)
	firstRunCall(t, h, key, run, 5)
	loseRunKeys(t, h, runID)
	dearer := fakeGPTCost(14, 40)
	if err := h.rdb.HSet(context.Background(), h.keys.Usage(runID), "calls", 1, "in_tok", 14, "out_tok", 40, "cost_micro", dearer).Err(); err != nil {
		t.Fatal(err)
	}
	if r := h.run(u.ID, runID); r.Calls != 2 || r.CostMicro >= dearer {
		t.Fatalf("run's row %+v: want both calls recorded, costing less than %d", r, dearer)
	}
	if status, body := settleAfterRebuild(h, key, name, runID); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.CostMicro != dearer || r.Calls != 1 {
		t.Fatalf("settled run %+v: want the tally's cost %d (1 call), which is more than the row's", r, dearer)
	}
}

// TestFreeModelsRunSettledFromItsTallyWhenItCountsMoreCallsThanItsRow: a free model's calls
// all cost 0, so the run's tally and its row's record tie on cost, and the one recording more
// calls is charged: here the tally, which has a call whose record on the row never landed
// (retryRunCallEnd gave up). Taken on the tie, the row settled the run without that call's
// tokens and call.
func TestFreeModelsRunSettledFromItsTallyWhenItCountsMoreCallsThanItsRow(t *testing.T) {
	h := newHarness(t, freeFakeGPT)
	u, key := h.user("standard")
	const name = "free-unrecorded"
	run := map[string]string{"X-Run-Id": name}
	runID := firstRunCall(t, h, key, run, 40)
	// The second call's tally, 5 output tokens, unrecorded on the row.
	usage := h.keys.Usage(runID)
	if err := h.rdb.HIncrBy(context.Background(), usage, "calls", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := h.rdb.HIncrBy(context.Background(), usage, "out_tok", 5).Err(); err != nil {
		t.Fatal(err)
	}
	if status, body := h.settleRun(key, name); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 || r.OutTok != 45 || r.ChargedMicro != 0 {
		t.Fatalf("settled run %+v: want the tally's 2 calls, 45 output tokens, charged 0", r)
	}
}

// TestNamedRunSettledFromItsRowKeepsItsTallysEstimatedMark: a Redis restart lost a named run's
// two ended calls from its tally (its row records them), and a call ended since was charged an
// estimate, its record on the row never landed: only the tally marks the estimate. The row
// records more and is charged, and the settled run is still marked estimated, as the
// reconciler marks it. Read from the record charged, the mark went with the call's record.
func TestNamedRunSettledFromItsRowKeepsItsTallysEstimatedMark(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const name = "task-estimate-unrecorded"
	run := map[string]string{"X-Run-Id": name}
	runID := firstRunCall(t, h, key, run, 40)
	firstRunCall(t, h, key, run, 40)
	loseRunKeys(t, h, runID)
	if err := h.rdb.HSet(context.Background(), h.keys.Usage(runID), "calls", 1, "in_tok", 14, "out_tok", 1,
		"cost_micro", fakeGPTCost(14, 1), "est_calls", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if r := h.run(u.ID, runID); r.Calls != 2 || r.Estimated {
		t.Fatalf("run's row %+v: want both calls recorded, not estimated", r)
	}
	if status, body := settleAfterRebuild(h, key, name, runID); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 || r.OutTok != 80 || !r.Estimated {
		t.Fatalf("settled run %+v: want its row's 2 calls (80 output tokens), marked estimated", r)
	}
}
