package holds_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestAvailableDoesNotWrap: allowance and prepaid at values the admin API accepts
// (ParseCredits: at most 12 digits of credits and no more than MaxInt64 micro-USD) must not
// wrap into a negative balance.
func TestAvailableDoesNotWrap(t *testing.T) {
	const creditMicro = 10_000_000 // a product of 2s and 5s, so config accepts it
	allowance, err := pricing.ParseCredits("922337203685", creditMicro)
	if err != nil {
		t.Fatal(err)
	}
	if got := holds.Available(allowance, 0, 10*creditMicro, 0); got < 0 {
		t.Errorf("Available(%d, 0, %d, 0) = %d: wrapped", allowance, 10*creditMicro, got)
	}
	f := newSettleFixture(t)
	ctx := context.Background()
	if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.store.Grant(ctx, holds.GrantRequest{UserID: f.user.ID, AmountMicro: 10 * creditMicro, IdempotencyKey: "wrap"}); err != nil {
		t.Fatal(err)
	}
	_, err = f.store.Admit(ctx, holds.AdmitRequest{RunID: "r_rich", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true})
	if errors.Is(err, holds.ErrInsufficient) {
		t.Errorf("a user with %d micro-USD of allowance and %d prepaid refused as insufficient (MaxInt64 %d)", allowance, 10*creditMicro, int64(math.MaxInt64))
	} else if err != nil {
		t.Fatal(err)
	} else if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_rich", Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestRevivedRunCountsAgainstLimits: a named run whose hold expired stops counting in flight
// (what it held still counts until it settles); other calls are admitted beside it. A later
// call of the run pushes its expiry out again (d6ceae0) — it must not bring back a hold the
// balance and the in-flight limit no longer cover.
func TestRevivedRunCountsAgainstLimits(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	allowance, inFlight := int64(60_000), 2
	if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, &inFlight, nil); err != nil {
		t.Fatal(err)
	}
	named := holds.AdmitRequest{RunID: "x_paused", UserID: f.user.ID, ClientRunID: "paused", State: holds.StateRunning, TTL: time.Hour}
	if h, err := f.store.Admit(ctx, named); err != nil || h.HeldMicro != 20_000 {
		t.Fatalf("first call of the run: %+v, %v", h, err)
	}
	f.expire(named.RunID)
	var fresh []string
	for i := 0; i < 2; i++ {
		id := "r_fresh_" + strconv.Itoa(i)
		if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: id, UserID: f.user.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true}); err != nil {
			t.Fatalf("admit %s: %v", id, err)
		}
		fresh = append(fresh, id)
	}
	again, err := f.store.Admit(ctx, named)
	t.Logf("later call of the expired run: %+v, %v", again, err)
	bal, berr := f.store.Balance(ctx, f.user.ID)
	if berr != nil {
		t.Fatal(berr)
	}
	t.Logf("balance after: %+v", bal)
	var busy *holds.TooManyInFlightError
	if !errors.As(err, &busy) || bal.InFlight > inFlight || bal.AvailableMicro < 0 {
		t.Errorf("later call of the expired run: %v; %d holds in flight (limit %d) holding %d of an allowance of %d, available %d; want it refused as too many in flight",
			err, bal.InFlight, inFlight, bal.HeldMicro, allowance, bal.AvailableMicro)
	}
	for _, id := range append(fresh, named.RunID) { // the expired run too: nothing else settles it here
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExpiredUnsettledHoldCountsAgainstBalance: a hold whose expiry has passed but that the
// reconciler has not settled yet (its process was SIGKILLed mid-call; an agent's run idle
// past run_ttl) is still owed: the reconciler charges it its hold, or its tally up to its
// cap. Until then admissions must keep counting what it held, or they let the user spend the
// same credits twice, past DESIGN §3's bound of Σ (cap − hold) over the holds in flight
// together (found by TestChaosExactlyOnce: a user with less than a hold tier left, so every
// hold was its cap, overdrawn by a whole call).
func TestExpiredUnsettledHoldCountsAgainstBalance(t *testing.T) {
	for _, named := range []bool{false, true} {
		t.Run(map[bool]string{false: "killed call", true: "idle run"}[named], func(t *testing.T) {
			f := newSettleFixture(t)
			ctx := context.Background()
			allowance := int64(15_000) // below the 20 000 hold tier: hold = cap = what is left
			if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, nil, nil); err != nil {
				t.Fatal(err)
			}
			first := holds.AdmitRequest{RunID: "r_dead", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Hour}
			if named {
				first = holds.AdmitRequest{RunID: "x_idle", UserID: f.user.ID, ClientRunID: "idle", State: holds.StateRunning, TTL: time.Hour}
			}
			h1, err := f.store.Admit(ctx, first)
			if err != nil || h1.HeldMicro != allowance || h1.CapMicro != allowance {
				t.Fatalf("first hold: %+v, %v", h1, err)
			}
			// Its expiry passes before the reconciler's next scan.
			f.expire(first.RunID)
			bal, err := f.store.Balance(ctx, f.user.ID)
			if err != nil {
				t.Fatal(err)
			}
			if bal.AvailableMicro != 0 || bal.HeldMicro != allowance || bal.InFlight != 0 {
				t.Errorf("balance with the expired hold unsettled: available %d held %d in flight %d, want 0, %d, 0",
					bal.AvailableMicro, bal.HeldMicro, bal.InFlight, allowance)
			}
			h2, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: "r_next", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true})
			// The reconciler comes: the first hold is charged what it held (no tally), or its
			// tally, here all of its cap.
			if _, serr := f.store.Settle(ctx, holds.Settlement{RunID: first.RunID, Source: holds.SourceReconcileHold, ChargeHeld: true, OnlyIfExpired: true}); serr != nil {
				t.Fatal(serr)
			}
			if err == nil {
				// The second call spends what it was allowed to.
				if _, serr := f.store.Settle(ctx, holds.Settlement{RunID: "r_next", CostMicro: h2.CapMicro, Source: holds.SourceComplete}); serr != nil {
					t.Fatal(serr)
				}
				after, berr := f.store.Balance(ctx, f.user.ID)
				if berr != nil {
					t.Fatal(berr)
				}
				used := after.UsedTodayMicro
				t.Errorf("a call admitted against the credits of an expired, unsettled hold: %+v; charged %d on a balance of %d, overdraft %d over a bound of %d",
					h2, used, allowance, used-allowance, (h1.CapMicro-h1.HeldMicro)+(h2.CapMicro-h2.HeldMicro))
			} else if !errors.Is(err, holds.ErrInsufficient) {
				t.Fatalf("second admission: %v, want ErrInsufficient", err)
			}
		})
	}
}

// TestRevivalAndAnotherAdmissionInOneBatchShareTheInFlightLimit: a named run idle past its
// expiry is revived by its next call while another call of the same user is admitted, and
// the writer puts both admissions in one batch transaction. The revived run counts in flight
// again (README: "a later call that brings it back must fit them again, as a new hold
// would"), so whichever of the two comes second in the batch must find the slot the first
// took: both admitted would put the user past max_in_flight within a single transaction.
func TestRevivalAndAnotherAdmissionInOneBatchShareTheInFlightLimit(t *testing.T) {
	for _, revivalFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "revival first", false: "new call first"}[revivalFirst], func(t *testing.T) {
			f := newSettleFixture(t)
			ctx := context.Background()
			allowance, inFlight := int64(100_000), 2
			if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, &inFlight, nil); err != nil {
				t.Fatal(err)
			}
			named := holds.AdmitRequest{RunID: "x_idle_burst", UserID: f.user.ID, ClientRunID: "idle-burst", State: holds.StateRunning, TTL: time.Hour}
			if _, err := f.store.Admit(ctx, named); err != nil {
				t.Fatal(err)
			}
			f.expire(named.RunID)
			f.admit("r_running") // in flight: 1 of 2 (the idle run no longer counts)
			fresh := holds.AdmitRequest{RunID: "r_burst", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true}
			reqs, second := []holds.AdmitRequest{named, fresh}, "r_burst"
			if !revivalFirst {
				reqs, second = []holds.AdmitRequest{fresh, named}, named.RunID
			}
			out, err := f.store.AdmitBatch(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			var busy *holds.TooManyInFlightError
			if out[0].Err != nil || !errors.As(out[1].Err, &busy) {
				t.Errorf("batch %s then %s: %v / %v; want the first admitted and %s refused as too many in flight",
					reqs[0].RunID, reqs[1].RunID, out[0].Err, out[1].Err, second)
			}
			if bal, err := f.store.Balance(ctx, f.user.ID); err != nil || bal.InFlight > inFlight {
				t.Errorf("balance after the batch: %+v, %v; want at most %d in flight", bal, err, inFlight)
			}
			for _, id := range []string{named.RunID, "r_running", "r_burst"} {
				if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil && !errors.Is(err, holds.ErrRunNotFound) {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestRevivalRefusedWhenTheBalanceNoLongerCoversItsHold: a named run idles past its expiry
// and, meanwhile, an operator lowers the user's allowance below what the run holds. The run's
// next call would bring it back with the cap it was admitted with, against a balance that no
// longer covers even its hold: it must be refused as a new hold would be (README: "else 429
// or 402, and the reconciler settles the run").
func TestRevivalRefusedWhenTheBalanceNoLongerCoversItsHold(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	allowance := int64(60_000)
	if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	named := holds.AdmitRequest{RunID: "x_idle_plan_cut", UserID: f.user.ID, ClientRunID: "idle-plan-cut", State: holds.StateRunning, TTL: time.Hour}
	if h, err := f.store.Admit(ctx, named); err != nil || h.HeldMicro != 20_000 || h.CapMicro != 60_000 {
		t.Fatalf("first call of the run: %+v, %v", h, err)
	}
	f.expire(named.RunID)
	lowered := int64(10_000)
	if err := f.store.SetUserLimits(ctx, f.user.ID, &lowered, nil, nil); err != nil {
		t.Fatal(err)
	}
	if h, err := f.store.Admit(ctx, named); !errors.Is(err, holds.ErrInsufficient) {
		t.Errorf("later call of the idle run after the allowance fell to %d: %+v, %v; want ErrInsufficient", lowered, h, err)
	}
	if r, err := f.store.Run(ctx, f.user.ID, named.RunID); err != nil || !r.ExpiresAt.Before(r.ReadAt) {
		t.Errorf("run %+v, %v: a refused call must leave it expired (by the database clock), for the reconciler", r, err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: named.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestRevivalCountsItsOwnHoldOnce: a named run idle past its expiry is still owed (the
// aggregate holds it), so its revival is checked against the balance without it, then with it
// once: a user whose balance covers the run's hold exactly gets the run back. Counted twice, or
// asked to leave something over, the run's own hold refused its next call as insufficient.
func TestRevivalCountsItsOwnHoldOnce(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	allowance := int64(20_000)
	if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	named := holds.AdmitRequest{RunID: "x_idle_revived", UserID: f.user.ID, ClientRunID: "idle-revived", State: holds.StateRunning, TTL: time.Hour}
	if h, err := f.store.Admit(ctx, named); err != nil || h.HeldMicro != 20_000 {
		t.Fatalf("first call of the run: %+v, %v", h, err)
	}
	f.expire(named.RunID)
	if h, err := f.store.Admit(ctx, named); err != nil || !h.Existing {
		t.Errorf("later call of the idle run, its 20,000 hold all of the 20,000 allowance: %+v, %v; want the run back", h, err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: named.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
