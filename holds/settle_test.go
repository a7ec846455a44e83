package holds_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// settleFixture is a store on a fresh database with one user.
type settleFixture struct {
	t     testing.TB
	store *holds.Store
	user  holds.User
}

var settlePlans = map[string]holds.Plan{
	"standard": {AllowanceMicro: 2_000_000, HoldNormalMicro: 20_000, HoldHeavyMicro: 60_000, HeavyAfterTurns: 4,
		MaxInFlight: 3, MaxRunCostMicro: 500_000},
}

func newSettleFixture(t testing.TB) *settleFixture {
	return newSettleFixtureOn(t, testenv.MySQL(t))
}

// newSettleFixtureMidday is newSettleFixture with the database clock standing still at noon
// UTC (testenv.MySQLMidday), for a test whose charges must all land on one day's allowance.
func newSettleFixtureMidday(t testing.TB) *settleFixture {
	return newSettleFixtureOn(t, testenv.MySQLMidday(t))
}

func newSettleFixtureOn(t testing.TB, db *sqlx.DB) *settleFixture {
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	u, err := st.CreateUser(context.Background(), "settle-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	return &settleFixture{t: t, store: st, user: u}
}

func (f *settleFixture) admit(runID string) holds.Hold {
	f.t.Helper()
	h, err := f.store.Admit(context.Background(), holds.AdmitRequest{RunID: runID, UserID: f.user.ID,
		State: holds.StateRunning, TTL: time.Minute})
	if err != nil {
		f.t.Fatalf("admit %s: %v", runID, err)
	}
	return h
}

// setMaxInFlight sets the fixture's user's in-flight limit.
func (f *settleFixture) setMaxInFlight(n int) {
	f.t.Helper()
	if err := f.store.SetUserLimits(context.Background(), f.user.ID, nil, &n, nil); err != nil {
		f.t.Fatal(err)
	}
}

// expire sets runID's hold's expiry a second into the past, by the database's clock.
func (f *settleFixture) expire(runID string) {
	f.t.Helper()
	if _, err := f.store.DB().ExecContext(context.Background(),
		"UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = ?", runID); err != nil {
		f.t.Fatal(err)
	}
}

func TestSettleTwiceChargesOnce(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_twice")
	first, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_twice", CostMicro: 7_000, Source: holds.SourceComplete})
	if err != nil || !first.Applied || first.ChargedMicro != 7_000 {
		t.Fatalf("first settlement: %+v, %v", first, err)
	}
	second, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_twice", CostMicro: 9_000, Source: holds.SourceReconcile})
	if err != nil || second.Applied {
		t.Fatalf("second settlement: %+v, %v", second, err)
	}
	b, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID)
	if err != nil || b.UsedTodayMicro != 7_000 {
		t.Fatalf("balance %+v, %v: want 7000 used", b, err)
	}
}

// TestConcurrentSettlementsOfOneRunChargeOnce: sixteen settlements of one run at once (a
// completion and its retries, as a slow process and its replacement would send them): one
// wins, the others change nothing.
func TestConcurrentSettlementsOfOneRunChargeOnce(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_race")
	var wg sync.WaitGroup
	applied := make(chan int64, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_race", CostMicro: 5_000, Source: holds.SourceComplete})
			if err != nil {
				t.Error(err)
				return
			}
			if res.Applied {
				applied <- res.ChargedMicro
			}
		}()
	}
	wg.Wait()
	close(applied)
	if n := len(applied); n != 1 {
		t.Fatalf("%d settlements applied, want 1", n)
	}
}

// TestFirstChargesOfADayRaceOnTheLedgerInsert settles many runs of one user at once on a day
// with no ledger row yet: they queue on the user's lock (or share a batch), the first creates
// the day's row with its upsert and the rest add to it, and the ledger holds every charge.
func TestFirstChargesOfADayRaceOnTheLedgerInsert(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	maxInFlight := 64
	f.setMaxInFlight(maxInFlight)
	const runs = 40
	for i := 0; i < runs; i++ {
		f.admit(runName(i))
	}
	var wg sync.WaitGroup
	for i := 0; i < runs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.store.Settle(ctx, holds.Settlement{RunID: runName(i), CostMicro: 1_000, Source: holds.SourceComplete}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	b, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID)
	if err != nil || b.UsedTodayMicro != runs*1_000 || b.HeldMicro != 0 {
		t.Fatalf("balance %+v, %v: want %d used, nothing held", b, err, runs*1_000)
	}
}

func runName(i int) string { return "r_ledger_" + string(rune('a'+i/26)) + string(rune('a'+i%26)) }

func TestChargeIsClampedToTheCap(t *testing.T) {
	f := newSettleFixture(t)
	h := f.admit("r_clamp")
	res, err := f.store.Settle(context.Background(), holds.Settlement{RunID: "r_clamp", CostMicro: h.CapMicro * 3, Source: holds.SourceComplete})
	if err != nil || res.ChargedMicro != h.CapMicro || res.CostMicro != h.CapMicro*3 {
		t.Fatalf("settled %+v, %v: want charge clamped to cap %d", res, err, h.CapMicro)
	}
}

func TestSettleUnknownRun(t *testing.T) {
	f := newSettleFixture(t)
	_, err := f.store.Settle(context.Background(), holds.Settlement{RunID: "r_nope", Source: holds.SourceComplete})
	if err == nil {
		t.Fatal("settling an unknown run succeeded")
	}
}

func TestAdmitSameRunTwiceTakesOneHold(t *testing.T) {
	f := newSettleFixture(t)
	first := f.admit("r_again")
	second := f.admit("r_again")
	if first.Existing || !second.Existing || second.HeldMicro != first.HeldMicro {
		t.Fatalf("first %+v second %+v", first, second)
	}
	b, err := f.store.Balance(context.Background(), f.user.ID)
	if err != nil || b.InFlight != 1 || b.HeldMicro != first.HeldMicro {
		t.Fatalf("balance %+v, %v: want one hold", b, err)
	}
	if _, err := f.store.Settle(context.Background(), holds.Settlement{RunID: "r_again", Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Admit(context.Background(), holds.AdmitRequest{RunID: "r_again", UserID: f.user.ID,
		State: holds.StateRunning, TTL: time.Minute}); err == nil {
		t.Fatal("a settled run was admitted again")
	}
}

// TestFirstChargesOfManyUsersDoNotDeadlock settles the first charge of the day of many users
// at once, with no retries allowed: every one must commit the first time. Under REPEATABLE
// READ the ledger's "UPDATE, then INSERT" takes gap locks on missing rows, and neighbouring
// users' first inserts deadlock each other.
func TestFirstChargesOfManyUsersDoNotDeadlock(t *testing.T) {
	db := testenv.MySQL(t)
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 0, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	ctx := context.Background()
	const users = 300
	runs := make([]holds.Settlement, users)
	for i := range runs {
		u, err := st.CreateUser(ctx, "first-"+strconv.Itoa(i), "standard")
		if err != nil {
			t.Fatal(err)
		}
		runs[i] = holds.Settlement{RunID: "r_first_" + strconv.Itoa(i), UserID: u.ID, CostMicro: 1_000, Source: holds.SourceComplete}
		if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: runs[i].RunID, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	work := make(chan holds.Settlement)
	var failed atomic.Int64
	for w := 0; w < 48; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				if _, err := st.Settle(ctx, s); err != nil {
					failed.Add(1)
					t.Log(err)
				}
			}
		}()
	}
	for _, s := range runs {
		work <- s
	}
	close(work)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d first settlements of the day failed without retries", n, users)
	}
}

// TestSettleRetriesAnUnreachableDatabaseThenGivesUp: with MySQL out of reach a settlement
// keeps retrying with backoff until its deadline, then returns the error, so the caller can
// leave the run to the reconciler instead of hanging or charging nothing.
func TestSettleRetriesAnUnreachableDatabaseThenGivesUp(t *testing.T) {
	db, err := sqlx.Open("mysql", "u:p@tcp(127.0.0.1:1)/none?timeout=200ms")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	core, logs := observer.New(zap.WarnLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 1, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	_, err = st.Settle(ctx, holds.Settlement{RunID: "r_down", UserID: 1, CostMicro: 10, Source: holds.SourceComplete})
	if err == nil || !holds.IsUnavailable(err) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("settle against a dead database: %v", err)
	}
	// It kept trying until its context ended rather than failing at the first refusal. (Counted
	// in its retry log lines, not timed: a dial that fails when the deadline fires can return
	// a hair before the context reports it.)
	if n := logs.FilterMessage("database unavailable, retrying").Len(); n < 2 {
		t.Fatalf("gave up after %d retries: %v", n, err)
	}
}

// TestAuditFindsABrokenLedger: the check every money test ends with must itself be able to
// fail.
func TestAuditFindsABrokenLedger(t *testing.T) {
	db := testenv.MySQL(t)
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	ctx := context.Background()
	u, err := st.CreateUser(ctx, "audited", "standard")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Grant(ctx, holds.GrantRequest{UserID: u.ID, AmountMicro: 1_000, IdempotencyKey: "g1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: "r_audit", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Settle(ctx, holds.Settlement{RunID: "r_audit", UserID: u.ID, CostMicro: 700, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	if bad, err := holds.Audit(ctx, db); err != nil || len(bad) != 0 {
		t.Fatalf("sound books: %v %v", bad, err)
	}
	if _, err := db.Exec("UPDATE usage_days SET used_micro = used_micro + 1 WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE run_holds SET prepaid_part_micro = 5 WHERE run_id = 'r_audit'"); err != nil {
		t.Fatal(err)
	}
	bad, err := holds.Audit(ctx, db)
	if err != nil || len(bad) != 3 || bad[0].UserID != u.ID || bad[1].RunID != "r_audit" ||
		bad[2].UserID != u.ID || !strings.Contains(bad[2].Detail, "prepaid") {
		t.Fatalf("broken books: %+v %v", bad, err)
	}
	// Prepaid credits that neither a grant nor a charge explains.
	if _, err := db.Exec("UPDATE run_holds SET prepaid_part_micro = 0 WHERE run_id = 'r_audit'"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE usage_days SET used_micro = used_micro - 1 WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE users SET prepaid_micro = prepaid_micro + 1 WHERE id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	bad, err = holds.Audit(ctx, db)
	if err != nil || len(bad) != 1 || bad[0].UserID != u.ID || !strings.Contains(bad[0].Detail, "prepaid") {
		t.Fatalf("prepaid credits out of thin air: %+v %v", bad, err)
	}
}
