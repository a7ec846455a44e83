package holds_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestNamedRunsSpendingStormKeepsTheBalance: one user with a small balance runs several named
// runs, whose calls are admitted again through the batch writer and record what they used on
// the run's row (RecordRunCall) concurrently, up to the run's cap, while plain calls are
// admitted and settled through the same writer; then each named run is settled beside one
// more plain call's admission, which may share its batch. A named run counts against the
// balance at what its calls have used when that is more than its hold (owedMicro), so no
// admission may be given credits that recorded calls had already spent: each plain call's cap
// must be at most the balance less what the records committed before it was asked had the
// runs owe. (The plain calls' holds and charges only ever add to what the user owes, and a
// named run's settlement charges what it was counted at, its calls having used its cap: so
// that is a lower bound of what the admission's transaction counted, whatever the
// interleaving.) Counted at their holds alone, the runs' spending went unseen and dozens of
// plain calls were admitted against it. Afterwards: every charge is the discounted cost
// clamped to its hold's cap, as the row records it; nothing is held; the ledger is the sum of
// the charges (audited at cleanup); and the debt is within DESIGN §3's overdraft bound,
// Σ (charged − held).
func TestNamedRunsSpendingStormKeepsTheBalance(t *testing.T) {
	db := testenv.MySQL(t)
	const allowance, discount = 200_000, 2_500
	plans := map[string]holds.Plan{"standard": {AllowanceMicro: allowance, HoldNormalMicro: 10_000, HoldHeavyMicro: 30_000,
		HeavyAfterTurns: 4, MaxInFlight: 12, MaxRunCostMicro: 120_000, DiscountBP: discount}}
	st := holds.NewStore(db, plans, "standard", zap.NewNop())
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := testenv.RandomID(4)
	u, err := st.CreateUser(ctx, "runstorm-"+suffix, "standard")
	if err != nil {
		t.Fatal(err)
	}
	const named, perRun, plainCallers = 3, 2, 5

	// What the user is known to owe: the named runs at owedMicro of the records that have
	// committed, the plain calls not at all (a lower bound: theirs is never negative).
	type namedRun struct {
		id               string
		hold             holds.Hold
		reserved, record int64 // list cost reserved by its calls (its budget, as Redis keeps it) and recorded
	}
	var mu sync.Mutex
	var owes int64
	owed := func(r *namedRun) int64 {
		return max(r.hold.HeldMicro, min(r.hold.CapMicro, pricing.ApplyDiscount(r.record, r.hold.DiscountBP)))
	}
	runs := make([]*namedRun, named)
	for i := range runs {
		id := "x_storm_" + suffix + "_" + strconv.Itoa(i)
		h, err := st.Admit(ctx, holds.AdmitRequest{RunID: id, UserID: u.ID, ClientRunID: "agent-" + strconv.Itoa(i),
			Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		runs[i] = &namedRun{id: id, hold: h}
		owes += owed(runs[i])
	}

	var seen shapes
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 3, MaxBatch: 16, Linger: time.Millisecond,
		AdmitTimeout: 20 * time.Second, SettleTimeout: 20 * time.Second, OnBatch: seen.add})
	defer w.Close()

	var charges []stormCharge
	settle := func(run string, held, cap int64, cost int64) holds.Settled {
		res, err := w.Settle(ctx, holds.Settlement{RunID: run, UserID: u.ID, CostMicro: cost, Calls: 1, Source: holds.SourceComplete})
		if err != nil || !res.Applied {
			t.Errorf("settle %s: %+v, %v", run, res, err)
			return res
		}
		mu.Lock()
		charges = append(charges, stormCharge{run: run, user: u.ID, held: held, cap: cap, cost: cost, paid: res.ChargedMicro, discountBP: discount})
		mu.Unlock()
		return res
	}

	var calls sync.WaitGroup
	for ri, r := range runs {
		for c := range perRun {
			calls.Add(1)
			go func() {
				defer calls.Done()
				rng := rand.New(rand.NewPCG(uint64(ri), uint64(c)))
				for ctx.Err() == nil {
					// The run's budget: its calls go on until what they used reaches its cap.
					mu.Lock()
					if pricing.ApplyDiscount(r.reserved, discount) >= r.hold.CapMicro {
						mu.Unlock()
						return
					}
					cost := 4_000 + rng.Int64N(16_000)
					r.reserved += cost
					mu.Unlock()
					h, err := w.Admit(ctx, holds.AdmitRequest{RunID: r.id, UserID: u.ID, ClientRunID: "agent-" + strconv.Itoa(ri),
						Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour})
					if err != nil || !h.Existing {
						t.Errorf("call of %s: %+v, %v", r.id, h, err)
						return
					}
					if ok, err := st.RecordRunCall(ctx, r.id, token.New(), time.Hour, pricing.Usage{Input: 100, Output: 10}, cost, 1, false); err != nil || !ok {
						t.Errorf("record a call of %s: %v, %v", r.id, ok, err)
						return
					}
					mu.Lock()
					before := owed(r)
					r.record += cost
					owes += owed(r) - before
					mu.Unlock()
				}
			}()
		}
	}

	// plainCall admits a plain call and settles it; false: refused for want of credits.
	var admitted, beyond int
	plainCall := func(run string, rng *rand.Rand) bool {
		mu.Lock()
		known := owes
		mu.Unlock()
		h, err := w.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning,
			TTL: time.Minute, Fresh: true, Heavy: rng.IntN(3) == 0})
		switch {
		case errors.Is(err, holds.ErrInsufficient):
			return false
		case err != nil:
			t.Errorf("admit %s: %v", run, err)
			return false
		}
		mu.Lock()
		admitted++
		if h.CapMicro > allowance-known {
			beyond++
			t.Errorf("%s admitted with cap %d, held %d: the named runs' records had left at most %d", run, h.CapMicro, h.HeldMicro, allowance-known)
		}
		mu.Unlock()
		settle(run, h.HeldMicro, h.CapMicro, rng.Int64N(8_000))
		return true
	}
	var plain sync.WaitGroup
	for c := range plainCallers {
		plain.Add(1)
		go func() {
			defer plain.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 99))
			for j, refused := 0, 0; j < 60 && refused < 8 && ctx.Err() == nil; j++ {
				if plainCall("r_storm_"+suffix+"_"+strconv.Itoa(c)+"_"+strconv.Itoa(j), rng) {
					refused = 0
				} else {
					refused++
				}
			}
		}()
	}
	plain.Wait()
	calls.Wait()

	// Then each run, its calls having used its cap, is settled beside a plain call's admission
	// it may share a batch with: the batch takes the run out of its aggregate at what the
	// aggregate counted it, and the settlement charges that.
	var last sync.WaitGroup
	for ri, r := range runs {
		last.Add(2)
		go func() {
			defer last.Done()
			if res := settle(r.id, r.hold.HeldMicro, r.hold.CapMicro, r.record); res.Applied && res.ChargedMicro != owed(r) {
				t.Errorf("%s charged %d, counted at %d", r.id, res.ChargedMicro, owed(r))
			}
		}()
		go func() {
			defer last.Done()
			plainCall("r_storm_"+suffix+"_last_"+strconv.Itoa(ri), rand.New(rand.NewPCG(uint64(ri), 7)))
		}()
	}
	last.Wait()
	if ctx.Err() != nil {
		t.Fatalf("storm did not end in time: %v", ctx.Err())
	}
	mixed := 0
	for _, b := range seen.list() {
		if b.Err != nil {
			t.Errorf("batch failed: %v", b.Err)
		}
		if b.Settlements > 0 && b.Admissions > 0 {
			mixed++
		}
	}
	t.Logf("%d plain calls admitted (%d past what the runs' records left), %d charges, %d batches mixed settlements and admissions",
		admitted, beyond, len(charges), mixed)
	if admitted == 0 || mixed == 0 {
		t.Errorf("the storm did not race: %d plain calls admitted, %d mixed batches", admitted, mixed)
	}

	var total, overdraft int64
	for _, c := range charges {
		if want := min(pricing.ApplyDiscount(c.cost, c.discountBP), c.cap); c.paid != want {
			t.Errorf("%s: charged %d, want %d (cost %d, cap %d)", c.run, c.paid, want, c.cost, c.cap)
		}
		var row struct {
			State   holds.State `db:"state"`
			Charged int64       `db:"charged_micro"`
		}
		if err := db.GetContext(ctx, &row, "SELECT state, charged_micro FROM run_holds WHERE run_id = ?", c.run); err != nil {
			t.Fatal(err)
		}
		if row.State != holds.StateSettled || row.Charged != c.paid {
			t.Errorf("%s: row %+v, its settlement charged %d", c.run, row, c.paid)
		}
		total += c.paid
		overdraft += max(0, c.paid-c.held)
	}
	b, err := testenv.BalanceAllDays(ctx, st, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.InFlight != 0 || b.HeldMicro != 0 || b.SpentInRunsMicro != 0 || b.UsedTodayMicro != total {
		t.Errorf("after the storm: %+v; want nothing held and %d used", b, total)
	}
	if b.AvailableMicro < -overdraft {
		t.Errorf("available %d after the storm, below DESIGN §3's overdraft bound -%d", b.AvailableMicro, overdraft)
	}
}
