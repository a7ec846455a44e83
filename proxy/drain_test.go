package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestDrainSettlesEveryCallItLetIn storms the gateway while it drains: every call is either
// refused before anything is held (503 shutting_down) or served and settled by the time Drain
// returns. A call that entered after the drain's wait had begun was neither waited for nor
// refused: its hold outlived the process's exit (and Go's WaitGroup, counting from zero
// beside a Wait, may panic on it).
func TestDrainSettlesEveryCallItLetIn(t *testing.T) {
	h := newHarness(t, nil)
	const callers, maxCalls = 8, 200
	keys := make([]string, callers)
	for i := range keys {
		_, keys[i] = h.user("standard")
	}

	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		codes    = map[string]int{}
		served   = make(chan struct{}, callers*maxCalls)
		wg       sync.WaitGroup
	)
	for i, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < maxCalls; n++ {
				body := fmt.Sprintf(`{"model":"fake-gpt","messages":[{"role":"user","content":"drain %d-%d"}]}`, i, n)
				resp := h.post(key, "/v1/chat/completions", body, nil)
				b := readAll(t, resp.Body)
				resp.Body.Close()
				mu.Lock()
				statuses[resp.StatusCode]++
				if resp.StatusCode != http.StatusOK {
					codes[errorCode(t, b)]++
				}
				mu.Unlock()
				if resp.StatusCode == http.StatusServiceUnavailable {
					return // refused: the gateway is draining
				}
				served <- struct{}{}
			}
		}()
	}
	for range 4 * callers { // drain with calls in flight, not before the first ones
		<-served
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.srv.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if _, live := h.holdCount(); live != 0 {
		t.Fatalf("%d holds still live when Drain returned: a call it let in was not waited for", live)
	}
	wg.Wait()

	// A call after the drain is refused before its admission.
	resp := h.post(keys[0], "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"late"}]}`, nil)
	b := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, b) != "shutting_down" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("call after the drain: %d %s (Retry-After %q), want 503 shutting_down with Retry-After",
			resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	all, live := h.holdCount()
	if live != 0 || all != statuses[http.StatusOK] {
		t.Fatalf("holds: %d (%d live), want one settled per call served (%d)", all, live, statuses[http.StatusOK])
	}
	if len(statuses) != 2 || statuses[http.StatusServiceUnavailable] != callers || codes["shutting_down"] != callers {
		t.Fatalf("statuses %v, codes %v: want only 200s and each caller's one 503 shutting_down", statuses, codes)
	}
}

// TestDrainWaitsForARunSettledOnRequest: a named run's POST /v1/runs/{id}/settle closes the
// run in Redis, then commits its settlement. Drain, which graceful shutdown waits on once the
// listener is closed (and the connections it had to cut at the deadline are gone), waited only
// for model calls and their deferred settlements: with the settle's transaction still waiting
// for the database, it reported nothing in flight, and the process exited under it — the run
// left closed, its calls answered 409 run_settled, and not settled until it expired. While such
// a settle runs, Drain must not report the gateway idle.
func TestDrainWaitsForARunSettledOnRequest(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "drain-settle"}, 5)

	// The settlement waits for the user's row, as behind a slow or stalled database.
	lock := testenv.ConsoleTx(t, h.db)
	var id uint64
	if err := lock.Get(&id, "SELECT id FROM users WHERE id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			_ = lock.Rollback()
		}
	}
	t.Cleanup(unlock)
	settled := make(chan int, 1)
	settle := h.newRequest(key, "/v1/runs/drain-settle/settle", "", nil)
	go func() {
		resp, err := http.DefaultClient.Do(settle)
		if err != nil {
			settled <- 0
			return
		}
		resp.Body.Close()
		settled <- resp.StatusCode
	}()
	// The run is closed for its settlement, whose transaction waits for the user's row.
	waitFor(t, "the settle to close the run", func() bool {
		n, err := h.rdb.HExists(context.Background(), h.keys.RunBudget(runID), "closed").Result()
		return err == nil && n
	})
	waitForStatement(t, h.db, "FROM users WHERE id%FOR UPDATE")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := h.srv.Drain(ctx)
	if err == nil {
		var state string
		if err := h.db.Get(&state, "SELECT state FROM run_holds WHERE run_id = ?", runID); err != nil {
			t.Fatal(err)
		}
		t.Errorf("Drain reported nothing in flight while the run's settlement on request was still committing (run %s)", state)
	}
	unlock()
	if status := <-settled; status != http.StatusOK {
		t.Fatalf("settle: %d, want 200 once the database answers", status)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled {
		t.Fatalf("run %s after its settle, want settled", r.State)
	}
	// A settle after the drain began is refused before it closes anything, as a call is.
	status, body := h.settleRun(key, "drain-settle")
	if status != http.StatusServiceUnavailable || errorCode(t, body) != "shutting_down" {
		t.Fatalf("settle after the drain: %d %s, want 503 shutting_down", status, body)
	}
}

// TestDrainReportsASettlementStillRunningAtItsDeadline: a call's settlement runs after its
// caller has the answer. Graceful shutdown logs what Drain says was cut: a Drain whose
// deadline passed under a settlement must say so ("settlements in flight"), not report the
// gateway idle, and a Drain after that settlement ends reports nothing left.
func TestDrainReportsASettlementStillRunningAtItsDeadline(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	reached, resume := h.holdAtFirst("settle")
	h.postOK(t, key, "/v1/chat/completions", chatBody, nil)
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the call's settlement never began")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := h.srv.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "settlements in flight") {
		t.Fatalf("Drain past its deadline with a settlement held: %v, want settlements in flight: context deadline exceeded", err)
	}
	resume()
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.srv.Drain(ctx); err != nil {
		t.Fatalf("Drain once the settlement could go on: %v", err)
	}
	if _, live := h.holdCount(); live != 0 {
		t.Fatalf("%d holds still live when Drain returned", live)
	}
}
