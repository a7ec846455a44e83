package holds_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// backlogHold is what the reconciler must do with one hold of a backlog.
type backlogHold struct {
	runID   string
	userID  uint64
	leased  bool   // another live process serves it: extended, not settled
	source  string // the settle_source it must end with
	charged int64  // what it must be charged
}

// buildBacklog writes n expired holds across users, as a mass failure leaves them: most with a
// tally in Redis, some without (running: charged their hold; queued: released), some named
// runs whose row records their calls, and some still leased by a live process. Rows go in with
// multi-row INSERTs (admitting 20 000 holds one by one would test admission, not the drain).
func buildBacklog(t *testing.T, e *storeEnv, n int, users []holds.User) map[string]backlogHold {
	t.Helper()
	ctx := e.ctx()
	out := make(map[string]backlogHold, n)
	const chunk = 500
	for start := 0; start < n; start += chunk {
		var q strings.Builder
		q.WriteString(`INSERT INTO run_holds (run_id, user_id, client_run_id, state, held_micro, cap_micro, discount_bp,
			cost_micro, calls, in_tok, out_tok, model, expires_at) VALUES `)
		var args []any
		for i := start; i < min(start+chunk, n); i++ {
			u := users[i%len(users)]
			discount := 0
			if u.ID%2 == 1 {
				discount = 1000
			}
			h := backlogHold{runID: fmt.Sprintf("r_bl_%06d", i), userID: u.ID}
			state := holds.StateRunning
			var clientRun any
			var rowCost, rowCalls int64
			switch i % 10 {
			case 0, 1, 2, 3: // tallied
				cost := int64(1000 + 37*(i%500))
				if i%97 == 0 {
					cost = 3 * testMaxRunCost // over the cap: clamped
				}
				e.addTally(h.runID, pricing.Usage{Input: 100, Output: 10}, cost)
				h.source, h.charged = holds.SourceReconcile, min(pricing.ApplyDiscount(cost, discount), testMaxRunCost)
			case 4, 5: // running, usage lost
				h.source, h.charged = holds.SourceReconcileHold, testHoldNormal
			case 6: // queued, never forwarded
				state = holds.StateQueued
				h.source, h.charged = holds.SourceRelease, 0
			case 7: // queued with a tally: the tally wins
				state = holds.StateQueued
				e.addTally(h.runID, pricing.Usage{Input: 10, Output: 1}, 500)
				h.source, h.charged = holds.SourceReconcile, pricing.ApplyDiscount(500, discount)
			case 8: // a named run: its row records 3 calls, its tally (after a Redis restart) only 1
				h.runID = fmt.Sprintf("x_bl_%06d", i)
				clientRun = fmt.Sprintf("agent-%d", i)
				rowCost, rowCalls = 2_100, 3
				e.addTally(h.runID, pricing.Usage{Input: 100, Output: 10}, 700)
				h.source, h.charged = holds.SourceReconcile, pricing.ApplyDiscount(2_100, discount)
			case 9: // still served by a live process
				h.leased = true
				if err := e.rdb.Set(ctx, e.keys.Lease(h.runID), "other-process", 10*time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if i > start {
				q.WriteString(",")
			}
			q.WriteString("(?,?,?,?,?,?,?,?,?,?,?,'fake-gpt', NOW(6) - INTERVAL ? SECOND)")
			args = append(args, h.runID, u.ID, clientRun, string(state), testHoldNormal, testMaxRunCost, discount,
				rowCost, rowCalls, rowCalls*100, rowCalls*10, 60+n-i)
			out[h.runID] = h
		}
		if _, err := e.db.ExecContext(ctx, q.String(), args...); err != nil {
			t.Fatalf("backlog insert: %v", err)
		}
	}
	return out
}

// checkBacklog asserts every hold of the backlog ended as it must: settled once, from the
// right source, at the right charge, and the leased ones still running.
func checkBacklog(t *testing.T, e *storeEnv, want map[string]backlogHold) {
	t.Helper()
	var rows []holds.Run
	if err := e.db.SelectContext(e.ctx(), &rows, `SELECT run_id, user_id, client_run_id, state, held_micro, cap_micro, cost_micro,
		charged_micro, allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok, out_tok, calls, model,
		discount_bp, estimated, settle_source, expires_at, created_at, settled_at FROM run_holds WHERE run_id LIKE '%\_bl\_%'`); err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(want) {
		t.Fatalf("%d backlog rows, want %d", len(rows), len(want))
	}
	bad := 0
	for _, r := range rows {
		w := want[r.RunID]
		var ok bool
		if w.leased {
			ok = r.State == holds.StateRunning && r.ExpiresAt.After(time.Now())
		} else {
			ok = r.State == holds.StateSettled && r.SettleSource.String == w.source && r.ChargedMicro == w.charged
		}
		if !ok {
			if bad++; bad <= 10 {
				t.Errorf("hold %s: state %s source %q charged %d expires %v; want %+v", r.RunID, r.State,
					r.SettleSource.String, r.ChargedMicro, r.ExpiresAt, w)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d backlog holds wrong", bad, len(rows))
	}
}

// TestReconcileBacklogAtScale: a mass failure leaves 2 000 expired holds over 40 users. Two
// gateways reconcile it at the same time, pass after pass, while a live user's calls are
// admitted and settled. Every pass is bounded; every hold ends settled once at its charge (or
// extended, when leased); nobody deadlocks; live admissions keep succeeding during the drain;
// the ledger equals the settled charges (the env's audit at cleanup).
func TestReconcileBacklogAtScale(t *testing.T) {
	e := newStoreEnv(t)
	var users []holds.User
	for i := range 40 {
		users = append(users, e.user(fmt.Sprintf("bl-%03d", i), 1000, nil))
	}
	// Four times what one pass may take (batch × maxBatches below): the drain takes several
	// passes, two reconcilers at once.
	const n = 2_000
	want := buildBacklog(t, e, n, users)
	live := e.user("live", 3, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const batch, maxBatches = 50, 10
	var applied, charged atomic.Int64
	// Each reconciler waits after its first pass for a live call to get through, so that live
	// admissions are known to succeed while the backlog is still being drained.
	firstLive := make(chan struct{})
	drain := func(instance string) error {
		rec := e.reconciler(instance, func(c *holds.ReconcilerConfig) {
			// Extended holds must not expire again before the check below.
			c.Batch, c.MaxBatches, c.ExtendBy = batch, maxBatches, time.Hour
		})
		for pass := 0; pass < 100; pass++ {
			st, err := rec.RunForced(ctx)
			if err != nil {
				return fmt.Errorf("%s pass %d: %w", instance, pass, err)
			}
			if st.Batches > maxBatches || st.Scanned > batch*maxBatches {
				return fmt.Errorf("%s pass %d unbounded: %+v", instance, pass, st)
			}
			applied.Add(int64(st.Settled()))
			charged.Add(st.ChargedMicro)
			if st.Scanned == 0 {
				return nil
			}
			if pass == 0 {
				select {
				case <-firstLive:
				case <-ctx.Done():
					return fmt.Errorf("%s: no live call admitted during the drain: %w", instance, ctx.Err())
				}
			}
		}
		return fmt.Errorf("%s: backlog not drained in 100 passes", instance)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	done := make(chan struct{})
	for i := range errs {
		wg.Go(func() { errs[i] = drain(fmt.Sprintf("gw%d", i)) })
	}
	var admitted, liveErrs atomic.Int64
	var liveWG sync.WaitGroup
	var liveOnce sync.Once
	signal := func() { liveOnce.Do(func() { close(firstLive) }) }
	liveWG.Go(func() {
		defer signal() // a failed live call must not leave the reconcilers waiting
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			run := fmt.Sprintf("r_live_%06d", i)
			if _, err := e.store.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: live.ID, Model: "fake-gpt",
				State: holds.StateRunning, TTL: time.Hour, Fresh: true}); err != nil {
				liveErrs.Add(1)
				t.Errorf("live admission during the drain: %v", err)
				return
			}
			admitted.Add(1)
			if _, err := e.store.Settle(ctx, holds.Settlement{RunID: run, UserID: live.ID, CostMicro: 100, Calls: 1,
				Source: holds.SourceComplete}); err != nil {
				t.Errorf("live settlement during the drain: %v", err)
				return
			}
			signal()
		}
	})
	wg.Wait()
	close(done)
	liveWG.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if admitted.Load() == 0 || liveErrs.Load() != 0 {
		t.Errorf("live admissions during the drain: %d admitted, %d failed", admitted.Load(), liveErrs.Load())
	}
	var wantApplied, wantCharged int64
	for _, h := range want {
		if !h.leased {
			wantApplied++
			wantCharged += h.charged
		}
	}
	if applied.Load() != wantApplied || charged.Load() != wantCharged {
		t.Errorf("the two reconcilers applied %d settlements charging %d, want %d charging %d",
			applied.Load(), charged.Load(), wantApplied, wantCharged)
	}
	checkBacklog(t, e, want)
	t.Logf("drained %d holds; %d live calls admitted meanwhile", n, admitted.Load())
}

// TestReconcileBacklogSurvivesMySQLGoingAway: the database goes away in the middle of a
// reconcile pass — a settlement's commit is sent, its reply lost, and nothing connects until
// it is back — and comes back. The pass that met the outage fails; the passes after it drain
// the backlog with every hold settled once at its charge, the lost-reply one included.
func TestReconcileBacklogSurvivesMySQLGoingAway(t *testing.T) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	e := &storeEnv{t: t, db: db}
	e.rdb, e.keys.Prefix = testenv.Redis(t)
	e.log = zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))
	e.store = holds.NewStore(db, testPlans(), "standard", e.log)
	e.store.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	e.tally = runstate.NewTally(e.rdb, e.keys, time.Hour)
	t.Cleanup(func() { lossy.Restore(); testenv.CheckLedger(t, db) })

	var users []holds.User
	for i := range 20 {
		users = append(users, e.user(fmt.Sprintf("mg-%02d", i), 1000, nil))
	}
	const n = 2_000
	want := buildBacklog(t, e, n, users)
	rec := e.reconciler("gw", func(c *holds.ReconcilerConfig) { c.Batch, c.MaxBatches, c.ExtendBy = 100, 5, time.Hour })

	// Let some holds settle, then lose the reply of a settlement's commit and stay down.
	st, err := e.pass(rec)
	if err != nil || st.Settled() == 0 {
		t.Fatalf("first pass: %+v, %v", st, err)
	}
	lossy.Arm(commitScript, testenv.GoDown)
	ctx, cancel := context.WithCancel(context.Background())
	passDone := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// The database stays away until the pass has run into it; then the pass gives up. A
		// pass that ends without running into it (the marker no longer matches) ends this
		// wait too, and the check below fails, rather than the test hanging here.
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for !lossy.Down() {
			select {
			case <-passDone:
				return
			case <-tick.C:
			}
		}
		cancel()
	})
	st, err = rec.RunForced(ctx)
	close(passDone)
	wg.Wait()
	cancel()
	if !lossy.Fired() || err == nil {
		t.Fatalf("pass into the outage: fired %v, %+v, %v; want it to fail", lossy.Fired(), st, err)
	}
	lossy.Restore()
	for pass := 0; ; pass++ {
		if pass == 20 {
			t.Fatal("backlog not drained after the database came back")
		}
		st, err := e.pass(rec)
		if err != nil {
			t.Fatalf("pass %d after the outage: %+v, %v", pass, st, err)
		}
		if st.Scanned == 0 {
			break
		}
	}
	checkBacklog(t, e, want)
}

// TestReconcileHoldsOfDisabledAndDeletedUsers: a disabled user's expired holds are settled
// like anyone's (the calls ran; disabling refuses the next admission, it forgives nothing). A
// hold whose user row is gone (deleted by hand: there is no foreign key) cannot be settled,
// and must not stop the reconciler from settling everyone else's holds behind it.
func TestReconcileHoldsOfDisabledAndDeletedUsers(t *testing.T) {
	e := newStoreEnv(t)
	gone := e.user("gone", 1000, nil)
	disabled := e.user("disabled", 1000, nil)
	others := []holds.User{e.user("o1", 1000, nil), e.user("o2", 1000, nil)}
	const batch = 5
	// The deleted user's holds expired first, a whole batch of them, so they head every scan.
	var goneRuns []string
	for i := range batch {
		h := e.admit(gone, fmt.Sprintf("r_gone_%d", i), holds.StateRunning)
		if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 HOUR WHERE run_id = ?", h.RunID); err != nil {
			t.Fatal(err)
		}
		goneRuns = append(goneRuns, h.RunID)
	}
	dh := e.admit(disabled, "r_disabled", holds.StateRunning)
	e.addTally(dh.RunID, pricing.Usage{Input: 100, Output: 10}, 4_000)
	e.expire(dh.RunID)
	var rest []string
	for i := range 3 * batch {
		h := e.admit(others[i%2], fmt.Sprintf("r_other_%02d", i), holds.StateRunning)
		e.addTally(h.RunID, pricing.Usage{Input: 10, Output: 1}, 1_000)
		e.expire(h.RunID)
		rest = append(rest, h.RunID)
	}
	if _, err := e.store.DisableUser(e.ctx(), disabled.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(e.ctx(), "DELETE FROM users WHERE id = ?", gone.ID); err != nil {
		t.Fatal(err)
	}

	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Batch, c.MaxBatches = batch, 10 })
	for range 3 {
		st, err := e.pass(rec)
		t.Logf("pass: %+v, %v", st, err)
	}
	if r := e.run(disabled, dh.RunID); r.State != holds.StateSettled || r.ChargedMicro != 4_000 || r.SettleSource.String != holds.SourceReconcile {
		t.Errorf("disabled user's hold: %+v; want settled from its tally at 4000", r)
	}
	unsettled := 0
	for i, id := range rest {
		if r := e.run(others[i%2], id); r.State != holds.StateSettled || r.ChargedMicro != 1_000 {
			unsettled++
		}
	}
	if unsettled > 0 {
		t.Errorf("%d of %d holds of other users left unsettled behind the deleted user's holds", unsettled, len(rest))
	}
	// The orphaned holds stay as they were, for an operator to look at.
	for _, id := range goneRuns {
		var state string
		if err := e.db.GetContext(e.ctx(), &state, "SELECT state FROM run_holds WHERE run_id = ?", id); err != nil || state != "running" {
			t.Errorf("orphaned hold %s: %q, %v", id, state, err)
		}
	}
}

// TestReconcileAcrossADayBoundary: a hold admitted yesterday, whose day's allowance its user
// had spent, is reconciled today: the charge lands on today's ledger row and is paid from
// today's allowance (DESIGN §3: the day of a charge is the UTC day of its settlement).
func TestReconcileAcrossADayBoundary(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("night-owl", 3, nil)
	allowance := int64(40_000)
	if err := e.store.SetUserLimits(e.ctx(), u.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	// Yesterday: one call spent the whole allowance; another was cut by a crash.
	spent := e.admit(u, "r_spent_yesterday", holds.StateRunning)
	crashed := e.admit(u, "r_crashed_yesterday", holds.StateRunning)
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: spent.RunID, CostMicro: allowance, Calls: 1,
		Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	e.addTally(crashed.RunID, pricing.Usage{Input: 100, Output: 10}, 8_000)
	for _, q := range []string{
		"UPDATE run_holds SET created_at = created_at - INTERVAL 1 DAY, settled_at = settled_at - INTERVAL 1 DAY WHERE run_id = 'r_spent_yesterday'",
		"UPDATE usage_days SET day = day - INTERVAL 1 DAY WHERE user_id = ?",
		"UPDATE run_holds SET created_at = created_at - INTERVAL 1 DAY, expires_at = UTC_DATE() - INTERVAL 1 MICROSECOND WHERE run_id = 'r_crashed_yesterday'",
	} {
		var args []any
		if strings.Contains(q, "?") {
			args = append(args, u.ID)
		}
		if _, err := e.db.ExecContext(e.ctx(), q, args...); err != nil {
			t.Fatal(err)
		}
	}
	var yesterday string // the day of the one row the user has, moved back
	if err := e.db.GetContext(e.ctx(), &yesterday, "SELECT DATE_FORMAT(day, '%Y-%m-%d') FROM usage_days WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if st, err := e.pass(e.reconciler("me", nil)); err != nil || st.FromTally != 1 {
		t.Fatalf("reconcile: %+v, %v", st, err)
	}
	r := e.run(u, crashed.RunID)
	if r.ChargedMicro != 8_000 || r.AllowancePart != 8_000 || r.PrepaidPart != 0 {
		t.Errorf("crashed run %+v: want 8000 from today's allowance", r)
	}
	// Today's: every row but yesterday's, which the test moved back (the reconciler's day and
	// the test's read may fall on either side of midnight UTC; neither is yesterday).
	var today int64
	if err := e.db.GetContext(e.ctx(), &today, "SELECT CAST(COALESCE(SUM(used_micro), 0) AS SIGNED) FROM usage_days WHERE user_id = ? AND day <> ?",
		u.ID, yesterday); err != nil {
		t.Fatal(err)
	}
	if today != 8_000 {
		t.Errorf("today's ledger %d, want 8000", today)
	}
}
