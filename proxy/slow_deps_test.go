package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// Dependencies that are degraded, not down: every reply comes, but late. The tests below put
// a testenv.Slow network between the gateway and Redis (each reply 50–300 ms late: a swapping
// host, a slow AOF fsync, a busy single thread) and MariaDB (20–100 ms: a slow disk, a far
// replica), and assert outcomes only — what each caller was answered, what each run was
// charged and by whom, that every hold settled once, and that the process came back to rest.

// slowHarness is a leak-watched gateway whose Redis and database answer through slowRedis and
// slowDB, both off until the test turns them on.
func slowHarness(t *testing.T, slowRedis, slowDB *testenv.Slow, mutate func(*config.Config)) *leakWatch {
	t.Helper()
	slowRedis.Off.Store(true)
	slowDB.Off.Store(true)
	db := testenv.Open(t, testenv.SlowMySQLDSN(t, slowDB))
	return leakHarnessOn(t, harnessSetup{db: db, redisDialer: slowRedis.Dial, contextTimeouts: true}, stormUpstream(nil),
		func(c *config.Config) {
			c.Plans["standard"] = stormPlan(c.Plans["standard"])
			if mutate != nil {
				mutate(c)
			}
		})
}

// TestStormBehindSlowRedisAndDatabaseChargesEachCallOnce: 64 calls of every kind — plain,
// streamed, of four named runs, of sessions, under Idempotency-Keys — while every Redis reply
// is 50–300 ms late and every database reply 20–100 ms late. Each is answered 200; each plain
// call's run is settled by its own call (complete), at its reported usage, never by a
// reconciler nor at its hold; each named run, settled by its caller, is charged exactly its
// calls; no tally write or settlement failed; and goroutines, connections, leases and
// reservations come back to rest.
func TestStormBehindSlowRedisAndDatabaseChargesEachCallOnce(t *testing.T) {
	slowRedis := &testenv.Slow{Min: 50 * time.Millisecond, Max: 300 * time.Millisecond}
	slowDB := &testenv.Slow{Min: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	w := slowHarness(t, slowRedis, slowDB, nil)
	u, key := w.h.user("standard")
	w.warm(key)
	// What one call costs, at full speed.
	base, _ := w.h.answeredRun(u.ID, key, "/v1/chat/completions", leakBody("ok", false), nil)
	if base.CostMicro <= 0 {
		t.Fatalf("the baseline call cost %d", base.CostMicro)
	}

	slowRedis.Off.Store(false)
	slowDB.Off.Store(false)
	const calls, runs = 64, 4
	perRun := map[string]int{}
	got := w.storm(calls, func(i int) *http.Request {
		var hdr map[string]string
		switch i % 4 {
		case 1:
			run := fmt.Sprintf("slow-%d", (i/4)%runs)
			hdr = map[string]string{"X-Run-Id": run}
		case 2:
			hdr = map[string]string{"X-Session-Id": fmt.Sprintf("slow-%d", i)}
		case 3:
			hdr = map[string]string{"Idempotency-Key": fmt.Sprintf("slow-%d", i)}
		}
		return w.request(key, "/v1/chat/completions", leakBody("ok", i%2 == 0)+strings.Repeat(" ", i), hdr)
	})
	for i := range calls {
		if i%4 == 1 {
			perRun[fmt.Sprintf("slow-%d", (i/4)%runs)]++
		}
	}
	if got[http.StatusOK] != calls {
		t.Fatalf("behind a slow Redis and database: %v, want all %d answered 200", got, calls)
	}
	for run := range perRun {
		if status, body := w.h.settleRun(key, run); status != http.StatusOK {
			t.Fatalf("settle %s behind a slow Redis and database: %d %s", run, status, body)
		}
	}
	if slowRedis.Delayed.Load() == 0 || slowDB.Delayed.Load() == 0 {
		t.Fatalf("replies delayed: Redis %d, database %d: the storm never met the slow network", slowRedis.Delayed.Load(), slowDB.Delayed.Load())
	}
	t.Logf("replies delayed: Redis %d, database %d", slowRedis.Delayed.Load(), slowDB.Delayed.Load())
	slowRedis.Off.Store(true)
	slowDB.Off.Store(true)
	w.back("a storm behind a slow Redis and database")

	var rows []struct {
		RunID     string  `db:"run_id"`
		Client    *string `db:"client_run_id"`
		State     string  `db:"state"`
		Source    *string `db:"settle_source"`
		Cost      int64   `db:"cost_micro"`
		Estimated bool    `db:"estimated"`
	}
	if err := w.h.db.Select(&rows, `SELECT run_id, client_run_id, state, settle_source, cost_micro, estimated
		FROM run_holds WHERE user_id = ? AND run_id <> ? AND created_at >= (SELECT created_at FROM run_holds WHERE run_id = ?)`,
		u.ID, base.RunID, base.RunID); err != nil {
		t.Fatal(err)
	}
	plain, named := 0, 0
	for _, r := range rows {
		source := "<none>"
		if r.Source != nil {
			source = *r.Source
		}
		if holds.State(r.State) != holds.StateSettled {
			t.Errorf("run %s is %s, want settled", r.RunID, r.State)
			continue
		}
		if r.Client == nil {
			plain++
			if source != holds.SourceComplete || r.Cost != base.CostMicro || r.Estimated {
				t.Errorf("run %s settled by %s at %d µUSD (estimated %t), want by its call (complete) at its usage, %d", r.RunID, source, r.Cost, r.Estimated, base.CostMicro)
			}
			continue
		}
		named++
		if want := int64(perRun[*r.Client]) * base.CostMicro; source != holds.SourceClient || r.Cost != want {
			t.Errorf("named run %s settled by %s at %d µUSD, want by its caller at its %d calls, %d", *r.Client, source, r.Cost, perRun[*r.Client], want)
		}
	}
	if plain != calls-calls/4 || named != runs {
		t.Errorf("%d plain runs and %d named runs, want %d and %d", plain, named, calls-calls/4, runs)
	}
	if n := testutil.ToFloat64(w.h.metrics.SettleFailures); n != 0 {
		t.Errorf("%v settlements failed behind the slow network", n)
	}
	if n := testutil.ToFloat64(w.h.metrics.TallyFailures); n != 0 {
		t.Errorf("%v tally writes failed behind the slow network", n)
	}
}

// TestStormBehindARedisSlowerThanItsBoundsFailsClosed: every Redis reply 1.1–1.6 s late — past
// the 1 s within which a call gives its fingerprint back with its tally (claimReleaseTimeout),
// and past the 2 s of a step on the caller's path whenever the step takes two round trips (a
// script's EVALSHA and its EVAL, a new connection's handshake). Some calls are refused, and
// each refusal is clean: 503 with its hold released at 0. Each call answered 200 is settled
// once, by its own call at its reported usage (its tally, which missed its bound, is the
// reconciler's fallback only). A named run's settle is refused 503 while Redis cannot read
// its tally in time, nothing charged; once Redis is back it settles at exactly the calls
// answered 200.
func TestStormBehindARedisSlowerThanItsBoundsFailsClosed(t *testing.T) {
	slowRedis := &testenv.Slow{Min: 1100 * time.Millisecond, Max: 1600 * time.Millisecond}
	w := slowHarness(t, slowRedis, &testenv.Slow{}, func(c *config.Config) { c.Limits.SettleTimeout = 10 * time.Second })
	u, key := w.h.user("standard")
	w.warm(key)
	base, _ := w.h.answeredRun(u.ID, key, "/v1/chat/completions", leakBody("ok", false), nil)

	slowRedis.Off.Store(false)
	const calls, runs = 16, 2
	named := func(i int) string { return fmt.Sprintf("vslow-%d", (i/4)%runs) }
	statuses := make([]int, calls)
	runIDs := make([]string, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var hdr map[string]string
			switch i % 4 {
			case 1:
				hdr = map[string]string{"X-Run-Id": named(i)}
			case 2:
				hdr = map[string]string{"X-Session-Id": fmt.Sprintf("vslow-%d", i)}
			case 3:
				hdr = map[string]string{"Idempotency-Key": fmt.Sprintf("vslow-%d", i)}
			}
			resp, err := w.client.Do(w.request(key, "/v1/chat/completions", leakBody("ok", i%2 == 0)+strings.Repeat(" ", i), hdr))
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i], runIDs[i] = resp.StatusCode, resp.Header.Get(proxy.RunIDHeader)
		}()
	}
	wg.Wait()
	answered := map[string]int{} // named run -> its calls answered 200
	for i, st := range statuses {
		if st != http.StatusOK && st != http.StatusServiceUnavailable {
			t.Errorf("call %d answered %d behind a very slow Redis, want 200 or a clean 503", i, st)
		}
		if st == http.StatusOK && i%4 == 1 {
			answered[named(i)]++
		}
	}
	t.Logf("behind a Redis 1.1–1.6 s late: statuses %v; tally failures %v", statuses, testutil.ToFloat64(w.h.metrics.TallyFailures))
	for r := range runs {
		run := fmt.Sprintf("vslow-%d", r)
		// 409 run_busy too: a call's end whose run tally is still being tried again (up to
		// settle_timeout, in the background) is not recorded yet, and the settle is refused
		// with nothing charged; the settle below, once Redis is back, settles it.
		status, body := w.h.settleRun(key, run)
		if status != http.StatusOK {
			code := errorCode(t, body)
			if !(status == http.StatusServiceUnavailable && code == "billing_unavailable") && !(status == http.StatusConflict && code == "run_busy") {
				t.Errorf("settle %s behind a very slow Redis: %d %s, want 200, 503 billing_unavailable or 409 run_busy", run, status, body)
			}
		}
	}
	slowRedis.Off.Store(true)
	w.h.settled()
	for r := range runs {
		run := fmt.Sprintf("vslow-%d", r)
		status, body := w.h.settleRun(key, run)
		if status == http.StatusNotFound {
			continue // no call of it was admitted
		}
		if status == http.StatusConflict && errorCode(t, body) == "run_busy" {
			status, body = settleRunWithoutTally(t, w.h, u.ID, key, run)
		}
		if status != http.StatusOK && (status != http.StatusConflict || errorCode(t, body) != "run_settled") {
			t.Errorf("settle %s once Redis is back: %d %s", run, status, body)
		}
	}
	w.back("a storm behind a very slow Redis")

	for i, id := range runIDs {
		if id == "" || i%4 == 1 {
			continue
		}
		r := w.h.run(u.ID, id)
		want, wantSource := base.CostMicro, holds.SourceComplete
		if statuses[i] != http.StatusOK {
			want, wantSource = 0, holds.SourceRelease
		}
		if r.State != holds.StateSettled || r.SettleSource.String != wantSource || r.CostMicro != want {
			t.Errorf("call %d (%d): run %s %s by %q at %d µUSD, want settled by %s at %d", i, statuses[i], id, r.State, r.SettleSource.String, r.CostMicro, wantSource, want)
		}
	}
	var rows []struct {
		Client string `db:"client_run_id"`
		State  string `db:"state"`
		Cost   int64  `db:"cost_micro"`
	}
	if err := w.h.db.Select(&rows, `SELECT client_run_id, state, cost_micro FROM run_holds WHERE user_id = ? AND client_run_id IS NOT NULL`, u.ID); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if want := int64(answered[r.Client]) * base.CostMicro; holds.State(r.State) != holds.StateSettled || r.Cost != want {
			t.Errorf("named run %s %s at %d µUSD, want settled at its %d calls answered 200, %d", r.Client, r.State, r.Cost, answered[r.Client], want)
		}
	}
}

// settleRunWithoutTally settles a named run that a settle found busy once Redis answered in
// time again, for the reasons that outlast the storm when every write of the run's tally and
// releases failed behind the slow Redis (its calls refused, their zero figures and releases
// tried until settle_timeout) — README § Agents: many calls, one hold: a run with no tally at
// all is busy while younger than the longest call, and a reservation no release dropped counts
// until it goes unstamped for lease_ttl. Its tally must be missing; aged past the longest call
// by the database clock, the run settles from its row's record of its calls once its
// reservations have lapsed.
func settleRunWithoutTally(t *testing.T, h *harness, userID uint64, key, run string) (int, []byte) {
	t.Helper()
	var runID string
	if err := h.db.Get(&runID, "SELECT run_id FROM run_holds WHERE user_id = ? AND client_run_id = ?", userID, run); err != nil {
		t.Fatalf("named run %s: %v", run, err)
	}
	if n, err := h.rdb.Exists(context.Background(), h.keys.Usage(runID)).Result(); err != nil || n != 0 {
		t.Errorf("settle %s once Redis is back: run_busy with its tally in Redis (%d, %v)", run, n, err)
	}
	if _, err := h.db.Exec("UPDATE run_holds SET created_at = created_at - INTERVAL 1 DAY WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(h.cfg.Holds.LeaseTTL + 10*time.Second)
	for {
		status, body := h.settleRun(key, run)
		if status != http.StatusConflict || errorCode(t, body) != "run_busy" || time.Now().After(deadline) {
			return status, body
		}
		time.Sleep(100 * time.Millisecond)
	}
}
