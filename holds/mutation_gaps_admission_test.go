package holds_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestEveryAdmissionUserOfABatchCountsItsLiveHolds: a batch carrying admissions of several
// users aggregates each one's live holds, not only the first one's: a user already at its
// in-flight limit is refused in a batch another user's admission opened, as it would be alone.
func TestEveryAdmissionUserOfABatchCountsItsLiveHolds(t *testing.T) {
	e := newStoreEnv(t)
	ctx := e.ctx()
	first := e.user("first-"+testenv.RandomID(3), 3, nil)
	full := e.user("full-"+testenv.RandomID(3), 1, nil)
	e.admit(full, "r_full_busy", holds.StateRunning)
	out, err := e.store.AdmitBatch(ctx, []holds.AdmitRequest{
		{RunID: "r_first_new", UserID: first.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true},
		{RunID: "r_full_new", UserID: full.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Err != nil {
		t.Fatalf("admission of a user with nothing in flight: %v", out[0].Err)
	}
	var busy *holds.TooManyInFlightError
	if !errors.As(out[1].Err, &busy) || busy.InFlight != 1 || busy.Limit != 1 {
		t.Errorf("admission of a user with 1 hold in flight of 1, second in its batch: %+v, %v; want TooManyInFlightError 1 of 1",
			out[1].Hold, out[1].Err)
	}
	settle := []string{"r_first_new", "r_full_busy"}
	if out[1].Err == nil {
		settle = append(settle, "r_full_new")
	}
	for _, id := range settle {
		if _, err := e.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCapClampIsLoggedOnlyWhenTheCapClamped: the money log's warning of cost past a run's cap
// is written for a settlement the cap clamped, with what it left uncharged, and for no other.
func TestCapClampIsLoggedOnlyWhenTheCapClamped(t *testing.T) {
	db := testenv.MySQL(t)
	core, logs := observer.New(zapcore.DebugLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	ctx := context.Background()
	u, err := st.CreateUser(ctx, "clamp-log-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	const clampedCost = 700_000 // past the 500000 cap
	for _, c := range []struct {
		run  string
		cost int64
	}{{"r_under_cap", 400_000}, {"r_at_cap", 500_000}, {"r_past_cap", clampedCost}} {
		if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: c.run, UserID: u.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Settle(ctx, holds.Settlement{RunID: c.run, CostMicro: c.cost, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	warned := logs.FilterMessage("cost past the run's cap not charged").All()
	if len(warned) != 1 {
		t.Fatalf("%d cap warnings for settlements under, at and past the cap: %+v; want one, for the run past it", len(warned), warned)
	}
	f := warned[0].ContextMap()
	if f["run_id"] != "r_past_cap" || f["uncharged_micro"] != int64(clampedCost-500_000) {
		t.Errorf("cap warning %v; want run r_past_cap with %d uncharged", f, clampedCost-500_000)
	}
}

// TestARefusalPastTheLimitCountsOnlyNamedRunsAsOpenRuns: the open runs a refusal past the
// in-flight limit reports are the named runs among what is in flight, those committed before
// and those admitted earlier in its own batch, not every hold.
func TestARefusalPastTheLimitCountsOnlyNamedRunsAsOpenRuns(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.setMaxInFlight(3)
	f.admit("r_open_call_before") // a call's hold, committed before the batch
	reqs := []holds.AdmitRequest{
		{RunID: "r_open_named", UserID: f.user.ID, ClientRunID: "open-named", State: holds.StateRunning, TTL: time.Hour},
		{RunID: "r_open_call", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true},
		{RunID: "r_open_refused", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true},
	}
	out, err := f.store.AdmitBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	var busy *holds.TooManyInFlightError
	if !errors.As(out[2].Err, &busy) || busy.InFlight != 3 || busy.OpenRuns != 1 || busy.Limit != 3 {
		t.Errorf("admission after a call committed before its batch and a named run and a call in it, limit 3: %+v, %v; want TooManyInFlightError 3 in flight, 1 open run",
			out[2].Hold, out[2].Err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_open_call_before", Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	for i, r := range out {
		if r.Err == nil {
			if _, err := f.store.Settle(ctx, holds.Settlement{RunID: reqs[i].RunID, Source: holds.SourceComplete}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestAnAdmissionWaitsForItsUsersLockBeforeCounting: an admission reads its user's live holds
// only once it holds the user's row lock, so a hold another transaction is committing under
// that lock (another gateway's admission) is counted: read before the lock, the admission
// counted without it and took the user past its in-flight limit.
func TestAnAdmissionWaitsForItsUsersLockBeforeCounting(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.setMaxInFlight(1)
	other := testenv.ConsoleTx(t, f.store.DB())
	if _, err := other.ExecContext(ctx, "SELECT id FROM users WHERE id = ? FOR UPDATE", f.user.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, expires_at)
		VALUES ('r_other_gateway', ?, 'running', 20000, 500000, NOW(6) + INTERVAL 1 HOUR)`, f.user.ID); err != nil {
		t.Fatal(err)
	}
	obs, err := f.store.DB().Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	done := make(chan error, 1)
	go func() {
		_, err := f.store.Admit(context.Background(), holds.AdmitRequest{RunID: "r_behind_lock", UserID: f.user.ID,
			State: holds.StateRunning, TTL: time.Hour, Fresh: true})
		done <- err
	}()
	// The admission waits for a lock (the user's, or, had it not asked for it, the new hold's
	// reference to the user) or ends: either way the other hold commits after its reads.
	finished := false
	deadline := time.Now().Add(30 * time.Second)
	for !finished {
		var waiting int
		if err := obs.GetContext(ctx, &waiting, `SELECT COUNT(*) FROM information_schema.innodb_trx t
			JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
			WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()`); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the admission neither waited for a lock nor ended within 30 s")
		}
		select {
		case err = <-done:
			finished = true
		case <-time.After(200 * time.Millisecond): // InnoDB refreshes innodb_trx only when unread for 0.1 s
		}
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	if !finished {
		err = <-done
	}
	var busy *holds.TooManyInFlightError
	if !errors.As(err, &busy) || busy.InFlight != 1 {
		t.Errorf("admission behind another transaction's hold of its user's only slot: %v; want TooManyInFlightError with 1 in flight", err)
	}
	settle := []string{"r_other_gateway"}
	if err == nil {
		settle = append(settle, "r_behind_lock")
	}
	for _, id := range settle {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAvailableSaturatesBelowToo: a user in debt with holds that together pass what an int64
// can hold below is left with nothing available, never with a wrapped, huge balance.
func TestAvailableSaturatesBelowToo(t *testing.T) {
	if got := holds.Available(0, 0, -2, math.MaxInt64); got != math.MinInt64 {
		t.Errorf("Available(0, 0, -2, MaxInt64) = %d; want MinInt64, saturated", got)
	}
	if got := holds.Available(0, 0, -1, math.MaxInt64); got != math.MinInt64 {
		t.Errorf("Available(0, 0, -1, MaxInt64) = %d; want MinInt64, exactly", got)
	}
	if got := holds.Available(10, 4, -3, 5); got != -2 {
		t.Errorf("Available(10, 4, -3, 5) = %d; want 6 of allowance - 3 owed - 5 held = -2", got)
	}
}
