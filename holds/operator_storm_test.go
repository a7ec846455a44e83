package holds_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// stormCharge is one settled call of the operator storm, as its caller saw it.
type stormCharge struct {
	run                   string
	user                  uint64
	held, cap, cost, paid int64
	discountBP            int
}

// standardUsers creates n users of the standard plan, named prefix, their index and suffix
// ("opstorm-2-x7k1"), and returns their ids.
func standardUsers(ctx context.Context, t *testing.T, st *holds.Store, n int, prefix, suffix string) []uint64 {
	t.Helper()
	ids := make([]uint64, n)
	for i := range ids {
		u, err := st.CreateUser(ctx, prefix+strconv.Itoa(i)+"-"+suffix, "standard")
		if err != nil {
			t.Fatalf("user %d of %d: %v", i, n, err)
		}
		ids[i] = u.ID
	}
	return ids
}

// TestOperatorStormKeepsBooksAndOverdraftBound runs admissions and settlements of several
// users through the batch writer while an operator, at the same time, tops their prepaid
// credits up, refunds them, moves them between plans, changes their discount and in-flight
// overrides, and disables and enables them. Whatever interleaving the database chose, the
// books must balance (Audit), each call must be charged at the discount and clamped to the
// cap its hold was admitted with, and no user's prepaid credits may end below what the
// overdraft bound of DESIGN §3 allows: Σ (charged − held) over the calls that spent beyond
// their holds (the allowance is not changed here, so nothing else can create debt).
func TestOperatorStormKeepsBooksAndOverdraftBound(t *testing.T) {
	db := testenv.MySQL(t)
	plans := map[string]holds.Plan{
		"standard": {AllowanceMicro: 60_000, HoldNormalMicro: 20_000, HoldHeavyMicro: 60_000, HeavyAfterTurns: 4,
			MaxInFlight: 4, MaxRunCostMicro: 90_000},
		"guest": {AllowanceMicro: 60_000, HoldNormalMicro: 10_000, HoldHeavyMicro: 30_000, HeavyAfterTurns: 2,
			MaxInFlight: 2, MaxRunCostMicro: 40_000, DiscountBP: 2_500},
	}
	st := holds.NewStore(db, plans, "standard", zap.NewNop())
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	suffix := testenv.RandomID(4)
	const users, callers, calls = 4, 6, 60
	ids := standardUsers(ctx, t, st, users, "opstorm-", suffix)
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 3, MaxBatch: 32, Linger: time.Millisecond,
		AdmitTimeout: 20 * time.Second, SettleTimeout: 20 * time.Second})
	defer w.Close()

	var mu sync.Mutex
	var charges []stormCharge
	var callersLeft atomic.Int32
	callersLeft.Store(users * callers)
	var wg sync.WaitGroup
	for ui, uid := range ids {
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer callersLeft.Add(-1)
				rng := rand.New(rand.NewPCG(uint64(ui), uint64(c)))
				for j := range calls {
					run := "r_ops_" + suffix + "_" + strconv.Itoa(ui) + "_" + strconv.Itoa(c) + "_" + strconv.Itoa(j)
					h, err := w.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: uid, Model: "fake-gpt",
						State: holds.StateRunning, TTL: time.Minute, Fresh: true, Heavy: rng.IntN(4) == 0})
					var busy *holds.TooManyInFlightError
					switch {
					case errors.As(err, &busy), errors.Is(err, holds.ErrInsufficient), errors.Is(err, holds.ErrUserDisabled):
						continue
					case err != nil:
						t.Error(err)
						return
					}
					cost := rng.Int64N(120_000)
					res, err := w.Settle(ctx, holds.Settlement{RunID: run, UserID: uid, CostMicro: cost, Calls: 1, Source: holds.SourceComplete})
					if err != nil || !res.Applied {
						t.Errorf("settle %s: %+v, %v", run, res, err)
						return
					}
					mu.Lock()
					charges = append(charges, stormCharge{run: run, user: uid, held: h.HeldMicro, cap: h.CapMicro, cost: cost,
						paid: res.ChargedMicro, discountBP: h.DiscountBP})
					mu.Unlock()
				}
			}()
		}
	}
	// The operator: one goroutine per kind of change, until the callers are done.
	operator := func(seed uint64, act func(rng *rand.Rand, uid uint64, n int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 73))
			for n := 0; callersLeft.Load() > 0; n++ {
				act(rng, ids[rng.IntN(len(ids))], n)
			}
		}()
	}
	var granted, refunded atomic.Int64
	operator(1, func(rng *rand.Rand, uid uint64, n int) {
		_, _, err := st.Grant(ctx, holds.GrantRequest{UserID: uid, AmountMicro: 5_000 + rng.Int64N(40_000),
			IdempotencyKey: "topup-" + suffix + "-" + strconv.Itoa(n)})
		if err != nil {
			t.Errorf("top-up: %v", err)
		}
		granted.Add(1)
	})
	operator(2, func(rng *rand.Rand, uid uint64, n int) {
		_, _, err := st.Grant(ctx, holds.GrantRequest{UserID: uid, AmountMicro: -(1_000 + rng.Int64N(30_000)),
			IdempotencyKey: "refund-" + suffix + "-" + strconv.Itoa(n)})
		switch {
		case errors.Is(err, holds.ErrGrantBelowZero):
		case err != nil:
			t.Errorf("refund: %v", err)
		default:
			refunded.Add(1)
		}
	})
	operator(3, func(rng *rand.Rand, uid uint64, n int) {
		c := holds.UserChange{Plan: []string{"standard", "guest"}[rng.IntN(2)]}
		switch rng.IntN(3) {
		case 0:
			c.DiscountBP = holds.SetTo(rng.IntN(10_001))
		case 1:
			c.DiscountBP = holds.Override[int]{Clear: true}
		}
		if rng.IntN(2) == 0 {
			c.MaxInFlight = holds.SetTo(1 + rng.IntN(6))
		} else {
			c.MaxInFlight = holds.Override[int]{Clear: true}
		}
		if err := st.ChangeUser(ctx, uid, c); err != nil {
			t.Errorf("change user: %v", err)
		}
	})
	operator(4, func(rng *rand.Rand, uid uint64, n int) {
		if _, err := st.DisableUser(ctx, uid); err != nil {
			t.Errorf("disable: %v", err)
		}
		if _, err := st.EnableUser(ctx, uid); err != nil {
			t.Errorf("enable: %v", err)
		}
	})
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%d calls charged, %d top-ups, %d refunds", len(charges), granted.Load(), refunded.Load())
	beyond := map[uint64]int64{}
	for _, c := range charges {
		want := min(pricing.ApplyDiscount(c.cost, c.discountBP), c.cap)
		if c.paid != want {
			t.Errorf("%s: charged %d, want %d (cost %d at %d bp, cap %d)", c.run, c.paid, want, c.cost, c.discountBP, c.cap)
		}
		var row struct {
			Discount int   `db:"discount_bp"`
			Charged  int64 `db:"charged_micro"`
		}
		if err := db.GetContext(ctx, &row, "SELECT discount_bp, charged_micro FROM run_holds WHERE run_id = ?", c.run); err != nil {
			t.Fatal(err)
		}
		if row.Discount != c.discountBP || row.Charged != c.paid {
			t.Errorf("%s: row %+v, caller saw discount %d charged %d", c.run, row, c.discountBP, c.paid)
		}
		beyond[c.user] += max(0, c.paid-c.held)
	}
	for _, uid := range ids {
		b, err := st.Balance(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		if b.HeldMicro != 0 || b.InFlight != 0 {
			t.Errorf("user %d: holds left behind: %+v", uid, b)
		}
		if b.PrepaidMicro < -beyond[uid] {
			t.Errorf("user %d: prepaid %d, below the overdraft bound -%d", uid, b.PrepaidMicro, beyond[uid])
		}
	}
}
