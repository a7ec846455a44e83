package holds_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// acctPlans are two plans that differ in every term a plan change could affect.
func acctPlans() map[string]holds.Plan {
	return map[string]holds.Plan{
		"standard": {AllowanceMicro: 2_000_000, HoldNormalMicro: 20_000, HoldHeavyMicro: 60_000, HeavyAfterTurns: 4,
			MaxInFlight: 3, MaxRunCostMicro: 500_000},
		"guest": {AllowanceMicro: 100_000, HoldNormalMicro: 10_000, HoldHeavyMicro: 30_000, HeavyAfterTurns: 2,
			MaxInFlight: 1, MaxRunCostMicro: 50_000, DiscountBP: 2_500},
	}
}

// acctFixture is a store on a fresh database; every test that uses it ends with the ledger check.
type acctFixture struct {
	t     *testing.T
	db    *sqlx.DB
	store *holds.Store
}

func newAcctFixture(t *testing.T) *acctFixture {
	t.Helper()
	return newAcctFixtureOn(t, testenv.MySQL(t))
}

// newAcctFixtureMidday is newAcctFixture with the database clock standing still at noon UTC
// (testenv.MySQLMidday), for a test whose charges must all land on one day's allowance.
func newAcctFixtureMidday(t *testing.T) *acctFixture {
	t.Helper()
	return newAcctFixtureOn(t, testenv.MySQLMidday(t))
}

func newAcctFixtureOn(t *testing.T, db *sqlx.DB) *acctFixture {
	t.Helper()
	st := holds.NewStore(db, acctPlans(), "standard", zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	return &acctFixture{t: t, db: db, store: st}
}

func (f *acctFixture) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	f.t.Cleanup(cancel)
	return ctx
}

func (f *acctFixture) user(name, plan string) holds.User {
	f.t.Helper()
	u, err := f.store.CreateUser(f.ctx(), name, plan)
	if err != nil {
		f.t.Fatal(err)
	}
	return u
}

func (f *acctFixture) admit(u holds.User, runID string) holds.Hold {
	f.t.Helper()
	h, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Minute})
	if err != nil {
		f.t.Fatalf("admit %s: %v", runID, err)
	}
	return h
}

func (f *acctFixture) settle(runID string, cost int64) holds.Settled {
	f.t.Helper()
	out, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: runID, CostMicro: cost, Calls: 1, Source: holds.SourceComplete})
	if err != nil || !out.Applied {
		f.t.Fatalf("settle %s: %+v, %v", runID, out, err)
	}
	return out
}

func (f *acctFixture) prepaid(u holds.User) int64 {
	f.t.Helper()
	var p int64
	if err := f.db.GetContext(f.ctx(), &p, "SELECT prepaid_micro FROM users WHERE id = ?", u.ID); err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *acctFixture) grant(u holds.User, amount int64, key string) holds.Grant {
	f.t.Helper()
	g, created, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: amount, IdempotencyKey: key, Reason: "test"})
	if err != nil || !created {
		f.t.Fatalf("grant %s: %+v created=%v, %v", key, g, created, err)
	}
	return g
}

// A payment webhook delivered 20 times at once credits once: every delivery answers with the
// same grant, one row exists, and prepaid went up by the amount once.
func TestGrantRetriedConcurrentlyCreditsOnce(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("payer", "standard")
	const n = 20
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ids     = map[uint64]int{}
		created int
		errs    []error
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			g, c, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 12_500,
				IdempotencyKey: "stripe:evt_1", Reason: "top-up"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			ids[g.ID]++
			if c {
				created++
			}
			if g.AmountMicro != 12_500 || g.BalanceAfterMicro != 12_500 {
				errs = append(errs, fmt.Errorf("grant %+v", g))
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d deliveries failed, first: %v", len(errs), errs[0])
	}
	if created != 1 || len(ids) != 1 {
		t.Fatalf("created %d grants, ids %v; want one grant answered %d times", created, ids, n)
	}
	if p := f.prepaid(u); p != 12_500 {
		t.Fatalf("prepaid %d, want 12500", p)
	}
	var rows int
	if err := f.db.GetContext(f.ctx(), &rows, "SELECT COUNT(*) FROM grants"); err != nil || rows != 1 {
		t.Fatalf("%d grant rows, %v", rows, err)
	}
	// A delivery after the fact still answers with the original, even though the balance moved.
	f.admit(u, "r_spend")
	if err := f.store.SetUserLimits(f.ctx(), u.ID, ptr[int64](0), nil, nil); err != nil {
		t.Fatal(err)
	}
	f.settle("r_spend", 2_500)
	g, c, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 12_500, IdempotencyKey: "stripe:evt_1", Reason: "retry"})
	if err != nil || c || g.BalanceAfterMicro != 12_500 {
		t.Fatalf("late retry: %+v created=%v, %v", g, c, err)
	}
	if p := f.prepaid(u); p != 10_000 {
		t.Fatalf("prepaid %d after spending 2500, want 10000", p)
	}
}

func ptr[T any](v T) *T { return &v }

// Two users' transactions racing on one key lock different user rows, so the unique key
// decides: one wins, the other is told the key is taken, and only one user is credited.
func TestGrantKeyRacedAcrossUsers(t *testing.T) {
	f := newAcctFixture(t)
	a, b := f.user("a", "standard"), f.user("b", "standard")
	var wg sync.WaitGroup
	results := make([]error, 20)
	for i := range results {
		u := a
		if i%2 == 1 {
			u = b
		}
		wg.Go(func() {
			_, _, results[i] = f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 1_000, IdempotencyKey: "shared"})
		})
	}
	wg.Wait()
	var ok, reused int
	for _, err := range results {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, holds.ErrGrantKeyReused):
			reused++
		default:
			t.Fatalf("unexpected: %v", err)
		}
	}
	if ok != 10 || reused != 10 {
		t.Fatalf("%d ok, %d reused; want the winner's 10 deliveries ok and the other 10 refused", ok, reused)
	}
	if pa, pb := f.prepaid(a), f.prepaid(b); pa+pb != 1_000 {
		t.Fatalf("prepaid a=%d b=%d, want 1000 in total", pa, pb)
	}
}

func TestGrantRefusals(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("refund", "standard")
	f.grant(u, 10_000, "buy")

	// A refund larger than what is left would create debt: refused, nothing changed.
	_, _, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: -10_001, IdempotencyKey: "refund-1"})
	if !errors.Is(err, holds.ErrGrantBelowZero) {
		t.Fatalf("refund past zero: %v", err)
	}
	if p := f.prepaid(u); p != 10_000 {
		t.Fatalf("prepaid %d after a refused refund", p)
	}
	// The refused key was not consumed: the corrected refund may use it.
	g := f.grant(u, -10_000, "refund-1")
	if g.BalanceAfterMicro != 0 {
		t.Fatalf("refund to zero: %+v", g)
	}
	// Same key, another amount: the caller has a bug; say so instead of replaying.
	if _, _, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 5_000, IdempotencyKey: "buy"}); !errors.Is(err, holds.ErrGrantKeyReused) {
		t.Fatalf("key reused with another amount: %v", err)
	}
	for _, req := range []holds.GrantRequest{
		{UserID: u.ID, AmountMicro: 0, IdempotencyKey: "zero"},
		{UserID: u.ID, AmountMicro: 1, IdempotencyKey: ""},
		{UserID: u.ID, AmountMicro: 1, IdempotencyKey: string(make([]byte, 129))},
	} {
		if _, _, err := f.store.Grant(f.ctx(), req); !errors.Is(err, holds.ErrGrantInvalid) {
			t.Errorf("grant %+v: %v, want ErrGrantInvalid", req, err)
		}
	}
	if _, _, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: 999_999, AmountMicro: 1, IdempotencyKey: "ghost"}); !errors.Is(err, holds.ErrUnknownUser) {
		t.Fatalf("grant to unknown user: %v", err)
	}
	list, err := f.store.Grants(f.ctx(), u.ID, 0, 10)
	if err != nil || len(list) != 2 || list[0].AmountMicro != -10_000 || list[1].BalanceAfterMicro != 10_000 {
		t.Fatalf("grants: %+v, %v", list, err)
	}
}

// TestRefundLeavesWhatCallsInFlightHold: a user whose calls run on prepaid credits (today's
// allowance used up) cannot be refunded the credits those calls hold: they settle against the
// balance, and would drive prepaid below zero. Once they have settled, the rest can go.
func TestRefundLeavesWhatCallsInFlightHold(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("refund-live", "standard")
	zero := int64(0)
	if err := f.store.SetUserLimits(f.ctx(), u.ID, &zero, nil, nil); err != nil {
		t.Fatal(err)
	}
	f.grant(u, 100_000, "buy-100")
	h := f.admit(u, "r_refund_live") // holds 20 credits of the prepaid 100
	_, _, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: -100_000, IdempotencyKey: "refund-all"})
	if !errors.Is(err, holds.ErrGrantBelowZero) {
		t.Fatalf("refund of credits a call in flight holds: %v, want ErrGrantBelowZero", err)
	}
	f.grant(u, -(100_000 - h.HeldMicro), "refund-free") // what the call does not hold may go
	f.settle(h.RunID, 7_000)
	if p := f.prepaid(u); p != h.HeldMicro-7_000 || p < 0 {
		t.Fatalf("prepaid %d after the call settled, want %d", p, h.HeldMicro-7_000)
	}
}

// A charge larger than what is left of today's allowance takes the rest from prepaid, in the
// same transaction, and the run records the split.
func TestChargeCrossesFromAllowanceIntoPrepaid(t *testing.T) {
	// The second charge finds the allowance used up only if it lands on the first one's day.
	f := newAcctFixtureMidday(t)
	u := f.user("crosser", "standard")
	if err := f.store.SetUserLimits(f.ctx(), u.ID, ptr[int64](30_000), nil, nil); err != nil {
		t.Fatal(err)
	}
	f.grant(u, 100_000, "topup")
	f.admit(u, "r_cross")
	out := f.settle("r_cross", 50_000)
	if out.ChargedMicro != 50_000 || out.AllowancePart != 30_000 || out.PrepaidPart != 20_000 {
		t.Fatalf("settled %+v, want 30000 from allowance and 20000 from prepaid", out)
	}
	run, err := f.store.Run(f.ctx(), u.ID, "r_cross")
	if err != nil || run.AllowancePart != 30_000 || run.PrepaidPart != 20_000 || run.ChargedMicro != 50_000 {
		t.Fatalf("run row %+v, %v", run, err)
	}
	b, err := testenv.BalanceAllDays(f.ctx(), f.store, u.ID)
	if err != nil || b.PrepaidMicro != 80_000 || b.UsedTodayMicro != 50_000 || b.AvailableMicro != 80_000 {
		t.Fatalf("balance %+v, %v", b, err)
	}
	// The next charge, allowance used up, comes wholly from prepaid.
	f.admit(u, "r_after")
	if out := f.settle("r_after", 5_000); out.AllowancePart != 0 || out.PrepaidPart != 5_000 {
		t.Fatalf("second charge %+v", out)
	}
}

// A run admitted before midnight UTC and settled after it lands on the day it settles, with
// that day's fresh allowance. The test moves the data, not the database's clock:
// yesterday's spending (the settled run and its ledger row together, so the ledger
// invariant still holds) and the open run's created_at go back one day; settlement then
// charges UTC_DATE(), today. The clock is the midday one: "today" is read after r_late
// settled, and a real midnight in between made its day yesterday's.
func TestChargeCrossesMidnightLandsOnSettlementDay(t *testing.T) {
	f := newAcctFixtureMidday(t)
	u := f.user("night-owl", "standard")
	if err := f.store.SetUserLimits(f.ctx(), u.ID, ptr[int64](30_000), nil, nil); err != nil {
		t.Fatal(err)
	}
	f.grant(u, 100_000, "topup")
	// Yesterday the user spent the whole allowance.
	f.admit(u, "r_yesterday")
	f.settle("r_yesterday", 30_000)
	f.admit(u, "r_late") // admitted "yesterday", at 23:59
	for _, q := range []string{
		"UPDATE run_holds SET settled_at = settled_at - INTERVAL 1 DAY, created_at = created_at - INTERVAL 1 DAY WHERE user_id = ? AND run_id = 'r_yesterday'",
		"UPDATE usage_days SET day = day - INTERVAL 1 DAY WHERE user_id = ?",
		"UPDATE run_holds SET created_at = TIMESTAMP(UTC_DATE()) - INTERVAL 1 SECOND WHERE user_id = ? AND run_id = 'r_late'",
	} {
		if _, err := f.db.ExecContext(f.ctx(), q, u.ID); err != nil {
			t.Fatal(err)
		}
	}
	out := f.settle("r_late", 40_000)
	// Today's allowance is fresh, so 30000 of it pays and 10000 comes from prepaid.
	if out.AllowancePart != 30_000 || out.PrepaidPart != 10_000 {
		t.Fatalf("settled %+v, want today's allowance used first", out)
	}
	var days []struct {
		Day     string `db:"day"`
		IsToday bool   `db:"is_today"`
		Used    int64  `db:"used_micro"`
	}
	if err := f.db.SelectContext(f.ctx(), &days, `SELECT DATE_FORMAT(day, '%Y-%m-%d') AS day, day = UTC_DATE() AS is_today, used_micro
		FROM usage_days WHERE user_id = ? ORDER BY day`, u.ID); err != nil {
		t.Fatal(err)
	}
	if len(days) != 2 || days[0].IsToday || days[0].Used != 30_000 || !days[1].IsToday || days[1].Used != 40_000 {
		t.Fatalf("day ledger %+v: want yesterday 30000 and today 40000", days)
	}
	var settledToday bool
	if err := f.db.GetContext(f.ctx(), &settledToday, "SELECT DATE(settled_at) = UTC_DATE() FROM run_holds WHERE run_id = 'r_late'"); err != nil || !settledToday {
		t.Fatalf("r_late settled today: %v, %v", settledToday, err)
	}
}

// Discounts are snapshotted on the hold: a plan or override change after admission does not
// change what an admitted run pays, and applies from the next admission on. The price
// snapshot given at settlement is kept on the row.
func TestDiscountSnapshotAndPlanChangeAtNextAdmission(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("shifter", "guest") // guest: 25% discount, one call in flight, 100-credit allowance
	h := f.admit(u, "r_guest")
	if h.DiscountBP != 2_500 || h.HeldMicro != 10_000 || h.CapMicro != 50_000 {
		t.Fatalf("guest hold %+v", h)
	}
	// Guest allows one call in flight.
	_, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: "r_second", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute})
	var tooMany *holds.TooManyInFlightError
	if !errors.As(err, &tooMany) {
		t.Fatalf("second guest call: %v", err)
	}
	if err := f.store.ChangeUser(f.ctx(), u.ID, holds.UserChange{Plan: "standard"}); err != nil {
		t.Fatal(err)
	}
	// The admitted run keeps its discount although the user's plan now has none.
	snap := []byte(`{"model":"fake-gpt","input":"1.25","output":"10","discount_bp":2500}`)
	out, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: "r_guest", CostMicro: 10_000, Calls: 1,
		Source: holds.SourceComplete, PriceSnapshot: snap, Model: "fake-gpt"})
	if err != nil || out.ChargedMicro != 7_500 || out.CostMicro != 10_000 {
		t.Fatalf("settle under the old discount: %+v, %v", out, err)
	}
	var row struct {
		DiscountBP int    `db:"discount_bp"`
		Snapshot   string `db:"price_snapshot"`
	}
	if err := f.db.GetContext(f.ctx(), &row, "SELECT discount_bp, price_snapshot FROM run_holds WHERE run_id = 'r_guest'"); err != nil {
		t.Fatal(err)
	}
	if row.DiscountBP != 2_500 || row.Snapshot != string(snap) {
		t.Fatalf("snapshot row %+v", row)
	}
	// The next admissions are standard: no discount, standard hold, three in flight.
	for i := range 3 {
		h := f.admit(u, fmt.Sprintf("r_std_%d", i))
		if h.DiscountBP != 0 || h.HeldMicro != 20_000 {
			t.Fatalf("standard hold %+v", h)
		}
	}
	// A per-user discount override applies from the next admission as well.
	if err := f.store.SetUserLimits(f.ctx(), u.ID, nil, ptr(10), ptr(1_000)); err != nil {
		t.Fatal(err)
	}
	if h := f.admit(u, "r_override"); h.DiscountBP != 1_000 {
		t.Fatalf("override hold %+v", h)
	}
	if out := f.settle("r_override", 10_000); out.ChargedMicro != 9_000 {
		t.Fatalf("10%% discount charged %d", out.ChargedMicro)
	}
	for i := range 3 {
		f.settle(fmt.Sprintf("r_std_%d", i), 1_000)
	}
	if err := f.store.ChangeUser(f.ctx(), u.ID, holds.UserChange{Plan: "platinum"}); !errors.Is(err, holds.ErrUnknownPlan) {
		t.Fatalf("unknown plan: %v", err)
	}
}

// TestGrantKeysAreExact: idempotency keys are opaque values (a payment provider's event id is
// case-sensitive base62): two keys that differ only in letter case, or by a trailing space,
// are two grants, each credited once.
func TestGrantKeysAreExact(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("exact-keys", "standard")
	f.grant(u, 10_000, "evt_1AbC")
	for _, key := range []string{"evt_1abc", "EVT_1ABC", "evt_1AbC "} {
		g, created, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 10_000, IdempotencyKey: key})
		if err != nil || !created {
			t.Errorf("grant %q after %q: created=%v (grant %d, key %q), %v; want a new grant", key, "evt_1AbC", created, g.ID, g.IdempotencyKey, err)
		}
	}
	if p := f.prepaid(u); p != 40_000 {
		t.Fatalf("prepaid %d after four grants of 10 credits under four distinct keys, want 40000", p)
	}
}

// TestLoweringTheAllowanceUnderCallsInFlightChargesThemToPrepaid: which part of a charge the
// day's allowance pays is decided at settlement, against the allowance then in force. Calls
// admitted against the old allowance and settled after it was taken away are charged wholly to
// prepaid credits, their holds included: a user without prepaid credits is left in debt by the
// whole of what those calls are charged (at most their caps), not only by what they spend
// beyond their holds. README says so.
func TestLoweringTheAllowanceUnderCallsInFlightChargesThemToPrepaid(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("downgraded", "standard")
	hs := []holds.Hold{f.admit(u, "r_down_1"), f.admit(u, "r_down_2"), f.admit(u, "r_down_3")}
	if err := f.store.SetUserLimits(f.ctx(), u.ID, ptr[int64](0), nil, nil); err != nil {
		t.Fatal(err)
	}
	var charged int64
	for _, h := range hs {
		out := f.settle(h.RunID, h.HeldMicro) // no call spends beyond its hold
		if out.AllowancePart != 0 || out.PrepaidPart != h.HeldMicro {
			t.Fatalf("settled %+v: want it all from prepaid", out)
		}
		charged += out.ChargedMicro
	}
	if p := f.prepaid(u); p != -charged {
		t.Fatalf("prepaid %d, want the debt of every charge, %d", p, -charged)
	}
}

// TestGrantThatWouldOverflowThePrepaidBalanceIsRefused: a credit that takes the prepaid balance
// past MaxInt64 would wrap it, in int64, into a debt near MinInt64: the grant is refused
// (ErrGrantInvalid) and nothing changes, as an operator's typo in the amount must not turn a
// rich user into a debtor.
func TestGrantThatWouldOverflowThePrepaidBalanceIsRefused(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("whale", "standard")
	f.grant(u, math.MaxInt64-10, "whale-1")
	if _, _, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 100, IdempotencyKey: "whale-2"}); !errors.Is(err, holds.ErrGrantInvalid) {
		t.Errorf("grant past MaxInt64: %v, want ErrGrantInvalid", err)
	}
	if p := f.prepaid(u); p != math.MaxInt64-10 {
		t.Errorf("prepaid %d after a refused grant, want %d", p, int64(math.MaxInt64-10))
	}
}
