package holds_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestNamedRunsSpendingCountsAgainstTheBalance: a named run's calls may spend up to its cap,
// past its hold, and its row records each ended call (RecordRunCall). The balance counted the
// run at its hold alone until it settled: /v1/credits showed as available credits the run had
// already spent (and then dropped at the settle), and a new admission was given them, its
// hold and cap reckoned from them. Each live hold now counts at what it holds or what its
// run's calls have used (at its charge: discounted, at most its cap), whichever is more — in
// the balance and in admission alike, a settlement sharing the admission's batch included.
func TestNamedRunsSpendingCountsAgainstTheBalance(t *testing.T) {
	for _, shared := range []bool{false, true} {
		name := "apart"
		if shared {
			name = "settled in the admission's batch"
		}
		t.Run(name, func(t *testing.T) {
			f := newAcctFixture(t)
			u := f.user("spender", "standard")
			allowance, discount := int64(100_000), 2_500
			if err := f.store.SetUserLimits(f.ctx(), u.ID, &allowance, nil, &discount); err != nil {
				t.Fatal(err)
			}
			run, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: "x_spender", UserID: u.ID, ClientRunID: "agent",
				Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if run.HeldMicro != 20_000 || run.CapMicro != 100_000 {
				t.Fatalf("run held %d, cap %d: want 20,000 and 100,000", run.HeldMicro, run.CapMicro)
			}
			// 120,000 at list price, 90,000 at 25 % off: past the hold, within the cap.
			if ok, err := f.store.RecordRunCall(f.ctx(), "x_spender", token.New(), time.Hour, pricing.Usage{Input: 10, Output: 5}, 120_000, 1, false); err != nil || !ok {
				t.Fatalf("record: %v, %v", ok, err)
			}
			b, err := f.store.Balance(f.ctx(), u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if b.HeldMicro != 90_000 || b.SpentInRunsMicro != 90_000 || b.AvailableMicro != 10_000 {
				t.Fatalf("balance with the run's calls at 90,000 charged: held %d, spent in runs %d, available %d; want 90,000, 90,000, 10,000",
					b.HeldMicro, b.SpentInRunsMicro, b.AvailableMicro)
			}

			next := holds.AdmitRequest{RunID: "r_spender_next", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute}
			var h holds.Hold
			if shared {
				settled, admitted, err := f.store.WriteBatch(f.ctx(),
					[]holds.Settlement{{RunID: "x_spender", CostMicro: 120_000, Calls: 1, Source: holds.SourceClient}}, []holds.AdmitRequest{next})
				if err != nil || settled[0].Err != nil || admitted[0].Err != nil {
					t.Fatalf("batch: %v, %+v, %+v", err, settled, admitted)
				}
				h = admitted[0].Hold
			} else {
				if h, err = f.store.Admit(f.ctx(), next); err != nil {
					t.Fatal(err)
				}
			}
			if h.HeldMicro != 10_000 || h.CapMicro != 10_000 {
				t.Fatalf("next call held %d, cap %d: want both the 10,000 left", h.HeldMicro, h.CapMicro)
			}
			if !shared {
				f.settle("x_spender", 120_000)
			}
			after, err := testenv.BalanceAllDays(f.ctx(), f.store, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if after.UsedTodayMicro != 90_000 || after.HeldMicro != 10_000 || after.SpentInRunsMicro != 0 || after.AvailableMicro != 0 {
				t.Fatalf("after the run's settlement: used today %d, held %d, spent in runs %d, available %d; want 90,000, 10,000, 0, 0",
					after.UsedTodayMicro, after.HeldMicro, after.SpentInRunsMicro, after.AvailableMicro)
			}
			f.settle("r_spender_next", 0)
		})
	}
}

// TestNamedRunsSpendingCountsToTheMicroItsSettlementCharges: the database's reckoning of what a
// named run's calls have spent (the admission aggregate and the balance, spentSQL) rounds a
// discounted cost as the settlement does (pricing.ApplyDiscount, up to the micro). Rounded
// down, every live run counted a micro-USD less than its settlement then charged, and that micro
// was given to the next admission: an overdraft past the hold the user was shown. The costs
// here leave a remainder past 10 000, where the two roundings part.
func TestNamedRunsSpendingCountsToTheMicroItsSettlementCharges(t *testing.T) {
	f := newAcctFixture(t)
	u, charge := namedRunSpentPastItsHold(t, f, "rounder", "x_rounder")
	const allowance, cost = roundingRunAllowance, roundingRunCost
	b, err := f.store.Balance(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.SpentInRunsMicro != charge || b.HeldMicro != charge || b.AvailableMicro != allowance-charge {
		t.Fatalf("balance with the run's call at %d charged: spent in runs %d, held %d, available %d; want %d, %d, %d",
			charge, b.SpentInRunsMicro, b.HeldMicro, b.AvailableMicro, charge, charge, allowance-charge)
	}
	next, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: "r_rounder_next", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if left := allowance - charge; next.HeldMicro != left || next.CapMicro != left {
		t.Fatalf("next call held %d, cap %d: want both the %d left", next.HeldMicro, next.CapMicro, left)
	}
	if s := f.settle("x_rounder", cost); s.ChargedMicro != charge {
		t.Fatalf("run charged %d, want %d", s.ChargedMicro, charge)
	}
	f.settle("r_rounder_next", 0)
}

// TestNamedRunSpentPastItsCapFreesOnlyItsCapInTheAdmissionsBatch: a named run's calls may
// record more than its cap (a call answered by a dearer model than its reservation was
// reckoned at); the run counts against its user's balance at most its cap (spentSQL), and its
// settlement charges no more. A settlement sharing an admission's batch must then free what
// the aggregate counted, the cap: freeing the uncapped figure gave the admission credits the
// user never had, a hold and a cap past the overdraft bound.
func TestNamedRunSpentPastItsCapFreesOnlyItsCapInTheAdmissionsBatch(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("overshooter", "standard")
	allowance, discount := int64(100_000), 2_500
	if err := f.store.SetUserLimits(f.ctx(), u.ID, &allowance, nil, &discount); err != nil {
		t.Fatal(err)
	}
	run, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: "x_overshooter", UserID: u.ID, ClientRunID: "agent",
		Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if run.CapMicro != 100_000 {
		t.Fatalf("run cap %d, want 100,000", run.CapMicro)
	}
	// 160,000 at list price, 120,000 at 25 % off: 20,000 past the cap.
	const cost = 160_000
	if ok, err := f.store.RecordRunCall(f.ctx(), "x_overshooter", token.New(), time.Hour, pricing.Usage{Input: 10, Output: 5}, cost, 1, false); err != nil || !ok {
		t.Fatalf("record: %v, %v", ok, err)
	}
	b, err := f.store.Balance(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.SpentInRunsMicro != 100_000 || b.AvailableMicro != 0 {
		t.Fatalf("balance with the run's calls past its cap: spent in runs %d, available %d; want 100,000 and 0",
			b.SpentInRunsMicro, b.AvailableMicro)
	}
	next := holds.AdmitRequest{RunID: "r_overshooter_next", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute}
	settled, admitted, err := f.store.WriteBatch(f.ctx(),
		[]holds.Settlement{{RunID: "x_overshooter", CostMicro: cost, Calls: 1, Source: holds.SourceClient}}, []holds.AdmitRequest{next})
	if err != nil || settled[0].Err != nil {
		t.Fatalf("batch: %v, %+v", err, settled)
	}
	if settled[0].ChargedMicro != 100_000 {
		t.Fatalf("run charged %d, want its cap, 100,000", settled[0].ChargedMicro)
	}
	if !errors.Is(admitted[0].Err, holds.ErrInsufficient) {
		t.Fatalf("next call with the whole allowance charged: %+v; want refused as insufficient", admitted[0])
	}
}

// roundingRunAllowance and roundingRunCost: an allowance, and a named run's call whose cost at
// roundingRunDiscount (25 % off) leaves a remainder past 10 000, where rounding down and up
// part: 90 000.75, charged 90 001.
const (
	roundingRunAllowance = int64(100_000)
	roundingRunDiscount  = 2_500
	roundingRunCost      = int64(120_001)
)

// namedRunSpentPastItsHold creates user name on roundingRunAllowance at roundingRunDiscount,
// with named run runID (X-Run-Id agent) live and one call of it recorded at roundingRunCost:
// spent past its hold. It returns the user and what the run's settlement charges.
func namedRunSpentPastItsHold(t *testing.T, f *acctFixture, name, runID string) (holds.User, int64) {
	t.Helper()
	u := f.user(name, "standard")
	allowance, discount := roundingRunAllowance, roundingRunDiscount
	if err := f.store.SetUserLimits(f.ctx(), u.ID, &allowance, nil, &discount); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, ClientRunID: "agent",
		Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.store.RecordRunCall(f.ctx(), runID, token.New(), time.Hour, pricing.Usage{Input: 10, Output: 5},
		roundingRunCost, 1, false); err != nil || !ok {
		t.Fatalf("record: %v, %v", ok, err)
	}
	return u, pricing.ApplyDiscount(roundingRunCost, discount)
}
