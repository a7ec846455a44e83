package holds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// The tests below each kill a mutant of the settlement and admission core (settle.go,
// admit.go) that every other test let live: each pins a piece of the arithmetic those tests
// reached only at values where the mutant agreed with the code.

// TestUnchargedIsWhatTheCapClampedOffTheDiscountedCost: what a settlement reports uncharged
// (the metric and the money log of what the provider charged that no one was) is the cost
// after the user's discount less the charge: the user never owed the discount, so it is not
// a loss. The clamped-settlement tests ran at no discount, where the cost and the discounted
// cost agree; counted from the list cost, both the settlement and the retry that finds its
// own settlement after a lost COMMIT reply reported the discount as uncharged too.
func TestUnchargedIsWhatTheCapClampedOffTheDiscountedCost(t *testing.T) {
	const discountBP = 5_000
	const cost = 1_200_000 // 600000 after the discount, past the 500000 cap
	for _, lost := range []bool{false, true} {
		t.Run(map[bool]string{false: "answered", true: "commit reply lost"}[lost], func(t *testing.T) {
			var f *settleFixture
			var lossy *testenv.Lossy
			if lost {
				f, lossy = newLossyFixture(t)
			} else {
				f = newSettleFixture(t)
			}
			ctx := context.Background()
			if err := f.store.SetUserLimits(ctx, f.user.ID, nil, nil, ptr(discountBP)); err != nil {
				t.Fatal(err)
			}
			var hooked []holds.Settled
			f.store.OnSettled(func(_ holds.Settlement, res holds.Settled) { hooked = append(hooked, res) })
			h := f.admit("r_discounted_clamped")
			if h.CapMicro != 500_000 || h.DiscountBP != discountBP {
				t.Fatalf("hold %+v, want the 500000 cap at a %d bp discount", h, discountBP)
			}
			if lost {
				lossy.Arm(commitScript, testenv.LoseReply)
			}
			res, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_discounted_clamped", CostMicro: cost, Source: holds.SourceComplete})
			if err != nil {
				t.Fatal(err)
			}
			if lost && !lossy.Fired() {
				t.Fatal("the settlement's commit reply was never lost")
			}
			if !res.Applied || res.CostMicro != cost || res.ChargedMicro != 500_000 || res.UnchargedMicro != 100_000 {
				t.Errorf("settled %+v; want cost %d charged the 500000 cap of the 600000 it came to after the discount, 100000 uncharged",
					res, cost)
			}
			if len(hooked) != 1 || hooked[0].UnchargedMicro != 100_000 {
				t.Errorf("settled hook told %+v; want once, with 100000 uncharged", hooked)
			}
		})
	}
}

// TestRetryOfAnExpiredCallIsAnsweredAtTheInFlightLimit: a retry of a one-call run (an
// Idempotency-Key, a redelivery) whose hold has expired is answered with the hold it took,
// not run: it takes no slot and pushes no expiry out, so it is not checked against the
// in-flight limit as a named run's revival is. Checked, a user at the limit had the retry of a
// call it had paid for refused as too many in flight.
func TestRetryOfAnExpiredCallIsAnsweredAtTheInFlightLimit(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	inFlight := 1
	f.setMaxInFlight(inFlight)
	first := f.admit("i_expired_attempt")
	f.expire(first.RunID)
	f.admit("r_in_flight") // 1 of 1: the expired hold no longer counts
	again, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: first.RunID, UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute})
	if err != nil || !again.Existing || again.HeldMicro != first.HeldMicro {
		t.Errorf("retry of the expired call at the in-flight limit: %+v, %v; want its hold answered", again, err)
	}
	for _, id := range []string{first.RunID, "r_in_flight"} {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestALaterCallOfANamedRunIsAnsweredWithItsRunsHold: a later call of a named run takes no
// second hold; it is answered with the run's, whose cap, discount and in-flight limit bound
// the call (the proxy's run budget is the cap). The tests of later calls checked only that the
// hold was reused, so an answer carrying the hold's amount as its cap went unseen.
func TestALaterCallOfANamedRunIsAnsweredWithItsRunsHold(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	if err := f.store.SetUserLimits(ctx, f.user.ID, nil, nil, ptr(2_500)); err != nil {
		t.Fatal(err)
	}
	req := holds.AdmitRequest{RunID: "x_later_call", UserID: f.user.ID, ClientRunID: "later-call", State: holds.StateRunning, TTL: time.Minute}
	first, err := f.store.Admit(ctx, req)
	if err != nil || first.HeldMicro != 20_000 || first.CapMicro != 500_000 || first.DiscountBP != 2_500 || first.MaxInFlight != 3 {
		t.Fatalf("first call of the run: %+v, %v; want a 20000 hold, a 500000 cap, 2500 bp off, 3 in flight", first, err)
	}
	again, err := f.store.Admit(ctx, req)
	if err != nil || !again.Existing || again.HeldMicro != first.HeldMicro || again.CapMicro != first.CapMicro ||
		again.DiscountBP != first.DiscountBP || again.MaxInFlight != first.MaxInFlight {
		t.Errorf("later call of the run: %+v, %v; want the run's hold %+v again", again, err, first)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: req.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestARunSettledInTheAdmissionsBatchIsNoLongerAnOpenRun: a named run settled earlier in the
// batch that refuses a call as too many in flight frees its slot, and is no longer one of the
// open runs the refusal names (the 429 tells the caller to settle the runs it is done with
// when it has any), while a named run opened earlier in the batch is one: counted still, the
// caller was told to settle a run it just had; not counted, it was not told of the one it had.
func TestARunSettledInTheAdmissionsBatchIsNoLongerAnOpenRun(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	inFlight := 2
	f.setMaxInFlight(inFlight)
	named := holds.AdmitRequest{RunID: "x_done_run", UserID: f.user.ID, ClientRunID: "done-run", State: holds.StateRunning, TTL: time.Minute}
	if _, err := f.store.Admit(ctx, named); err != nil {
		t.Fatal(err)
	}
	f.admit("r_busy") // 2 of 2 in flight, 1 of them an open run
	fresh := func(id string) holds.AdmitRequest {
		return holds.AdmitRequest{RunID: id, UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}
	}
	settled, admitted, err := f.store.WriteBatch(ctx, []holds.Settlement{{RunID: named.RunID, Source: holds.SourceClient}},
		[]holds.AdmitRequest{{RunID: "x_next_run", UserID: f.user.ID, ClientRunID: "next-run", State: holds.StateRunning, TTL: time.Minute},
			fresh("r_one_too_many")})
	if err != nil || settled[0].Err != nil || !settled[0].Applied {
		t.Fatalf("batch: %v, %+v", err, settled)
	}
	var busy *holds.TooManyInFlightError
	if admitted[0].Err != nil || !errors.As(admitted[1].Err, &busy) || busy.InFlight != 2 || busy.OpenRuns != 1 {
		t.Errorf("admissions after the run's settlement: %v / %v (%#v); want the new run admitted, the call refused at 2 in flight, 1 of them the new run",
			admitted[0].Err, admitted[1].Err, busy)
	}
	for _, id := range []string{"r_busy", "x_next_run"} {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestASettlementInTheAdmissionsBatchFreesItsSlot: a call settled in the batch of another
// call's admission frees its in-flight slot for it, as a settlement committed before would:
// the writer puts them together whenever they arrive together. Left counted, a user at its
// limit was refused the call its finished one made room for.
func TestASettlementInTheAdmissionsBatchFreesItsSlot(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	inFlight := 1
	f.setMaxInFlight(inFlight)
	f.admit("r_finishing") // 1 of 1 in flight
	settled, admitted, err := f.store.WriteBatch(ctx, []holds.Settlement{{RunID: "r_finishing", CostMicro: 1_000, Source: holds.SourceComplete}},
		[]holds.AdmitRequest{{RunID: "r_next", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}})
	if err != nil || settled[0].Err != nil || !settled[0].Applied {
		t.Fatalf("batch: %v, %+v", err, settled)
	}
	if admitted[0].Err != nil {
		t.Errorf("call admitted beside the settlement of the user's only call in flight: %v; want admitted", admitted[0].Err)
	} else if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_next", Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestARevivedRunsSecondCallInItsBatchTakesNoSlot: two calls of a named run idle past its
// expiry arrive together and share a batch. The first brings the run back, taking one slot;
// the second is a later call of a live run, as in any later batch, and takes none. Not
// remembered as revived, the run was brought back twice, and the second call was refused as
// too many in flight by the slot its own run had just taken.
func TestARevivedRunsSecondCallInItsBatchTakesNoSlot(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	inFlight := 2
	f.setMaxInFlight(inFlight)
	named := holds.AdmitRequest{RunID: "x_idle_pair", UserID: f.user.ID, ClientRunID: "idle-pair", State: holds.StateRunning, TTL: time.Minute}
	if _, err := f.store.Admit(ctx, named); err != nil {
		t.Fatal(err)
	}
	f.expire(named.RunID)
	f.admit("r_busy_pair") // 1 of 2 in flight: the idle run no longer counts
	out, err := f.store.AdmitBatch(ctx, []holds.AdmitRequest{named, named})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Err != nil || out[1].Err != nil || !out[1].Hold.Existing {
		t.Errorf("two calls of the revived run in one batch: %v / %v; want both admitted on the run's hold", out[0].Err, out[1].Err)
	}
	for _, id := range []string{named.RunID, "r_busy_pair"} {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAClaimedLostCommitHoldCarriesWhatItsRunRecorded: a named run's first admission
// committed and lost its reply; before its retry claims the hold (same token), a later call of
// the run — sent alongside by the same agent — was admitted on it, ended, and recorded its
// cost on the run's row. The claim answers what the row records (RecordedMicro), as a later
// call's admission does: the proxy's run budget counts it as spent when a Redis restart has
// lost the tally. Answered 0, that budget let the run's calls spend again what the row said
// was spent, past the run's cap.
func TestAClaimedLostCommitHoldCarriesWhatItsRunRecorded(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	first := holds.AdmitRequest{RunID: "x_claim_recorded", UserID: f.user.ID, ClientRunID: "claim-recorded",
		State: holds.StateRunning, TTL: time.Minute, Token: testenv.RandomID(16)}
	if _, err := f.store.Admit(ctx, first); err != nil { // its reply lost to the caller
		t.Fatal(err)
	}
	later := first
	later.Token = testenv.RandomID(16)
	if h, err := f.store.Admit(ctx, later); err != nil || !h.Existing {
		t.Fatalf("the run's later call: %+v, %v; want admitted on the run's hold", h, err)
	}
	const recorded = 7_000
	if ok, err := f.store.RecordRunCall(ctx, first.RunID, testenv.RandomID(16), time.Minute,
		pricing.Usage{Input: 1_000, Output: 100}, recorded, 1, false); err != nil || !ok {
		t.Fatalf("record the later call: %v, %v", ok, err)
	}
	claimed, err := f.store.Admit(ctx, first) // the first admission's retry: its own hold
	if err != nil || claimed.Existing || claimed.RecordedMicro != recorded {
		t.Errorf("the first admission's retry, claiming its hold: %+v, %v; want its own hold, %d recorded", claimed, err, recorded)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: first.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
