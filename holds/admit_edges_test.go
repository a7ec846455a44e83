package holds_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestBatchCountsItsOwnAdmissionsInFlight: admissions of one user in one batch are decided
// against each other, not only against the holds committed before it: the Writer puts a burst
// of one user's requests into one batch, and a batch that forgot its own holds let the burst
// past the in-flight limit whole.
func TestBatchCountsItsOwnAdmissionsInFlight(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	inFlight := 2
	f.setMaxInFlight(inFlight)
	reqs := make([]holds.AdmitRequest, inFlight+1)
	for i := range reqs {
		reqs[i] = holds.AdmitRequest{RunID: "r_burst_" + strconv.Itoa(i), UserID: f.user.ID, State: holds.StateRunning,
			TTL: time.Hour, Fresh: true}
	}
	out, err := f.store.AdmitBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range out[:inFlight] {
		if r.Err != nil {
			t.Fatalf("admission %d of %d within the limit: %v", i+1, len(reqs), r.Err)
		}
	}
	var busy *holds.TooManyInFlightError
	if last := out[inFlight]; !errors.As(last.Err, &busy) || busy.Limit != inFlight {
		t.Errorf("admission %d in one batch with a limit of %d in flight: %+v, %v; want TooManyInFlightError", inFlight+1, inFlight, last.Hold, last.Err)
	}
	if bal, err := f.store.Balance(ctx, f.user.ID); err != nil {
		t.Fatal(err)
	} else if bal.InFlight != inFlight {
		t.Errorf("%d holds in flight after the batch, limit %d", bal.InFlight, inFlight)
	}
	for i, r := range out {
		if r.Err == nil {
			if _, err := f.store.Settle(ctx, holds.Settlement{RunID: reqs[i].RunID, Source: holds.SourceComplete}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestHeavyTierFromTheThresholdTurn: the heavy hold applies from the plan's HeavyAfterTurns-th
// user turn on, the turn itself included (DESIGN §3), and not before it.
func TestHeavyTierFromTheThresholdTurn(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	plan := settlePlans["standard"]
	for _, c := range []struct {
		turns int
		want  int64
	}{
		{plan.HeavyAfterTurns - 1, plan.HoldNormalMicro},
		{plan.HeavyAfterTurns, plan.HoldHeavyMicro},
		{plan.HeavyAfterTurns + 1, plan.HoldHeavyMicro},
	} {
		id := "r_turns_" + strconv.Itoa(c.turns)
		h, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: id, UserID: f.user.ID, UserTurns: c.turns, State: holds.StateRunning,
			TTL: time.Hour, Fresh: true})
		if err != nil {
			t.Fatalf("admit at %d user turns: %v", c.turns, err)
		}
		if h.HeldMicro != c.want {
			t.Errorf("hold at %d user turns (heavy from %d): %d, want %d", c.turns, plan.HeavyAfterTurns, h.HeldMicro, c.want)
		}
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAnotherUsersRunIsNotFound: a run id admitted for one user is not found for another,
// whether or not the request carries the admission token the first user's hold was taken with:
// a second user must never ride, claim or revive a hold charged to the first (nor learn that
// the run exists).
func TestAnotherUsersRunIsNotFound(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	other, err := f.store.CreateUser(ctx, "other-"+strconv.FormatUint(f.user.ID, 10), "standard")
	if err != nil {
		t.Fatal(err)
	}
	const token = "0123456789abcdef0123456789abcdef"
	owned := holds.AdmitRequest{RunID: "x_owned", UserID: f.user.ID, ClientRunID: "owned", State: holds.StateRunning,
		TTL: time.Hour, Token: token}
	if _, err := f.store.Admit(ctx, owned); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"", token} {
		req := owned
		req.UserID, req.Token = other.ID, tok
		h, err := f.store.Admit(ctx, req)
		if !errors.Is(err, holds.ErrRunNotFound) {
			t.Errorf("another user's admission of the run (token %q): %+v, %v; want ErrRunNotFound", tok, h, err)
		}
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: owned.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestARunsLaterCallsInItsFirstBatchTakeNoSlot: a named run's first call and a later one in
// the same batch share the run's hold and its one in-flight slot, so a call of another run later
// in the batch still finds the slot left. A later call that took the first's new hold for an
// expired one revived it, counting the run in flight twice and refusing that call.
func TestARunsLaterCallsInItsFirstBatchTakeNoSlot(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	inFlight := 2
	f.setMaxInFlight(inFlight)
	call := holds.AdmitRequest{RunID: "x_slot", UserID: f.user.ID, ClientRunID: "slot", State: holds.StateRunning, TTL: time.Hour}
	out, err := f.store.AdmitBatch(ctx, []holds.AdmitRequest{call, call,
		{RunID: "r_slot_other", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range out {
		if a.Err != nil {
			t.Errorf("admission %d of a run's two calls and another run's, limit %d: %v; want all admitted", i, inFlight, a.Err)
		} else if !a.Hold.Existing {
			if _, err := f.store.Settle(ctx, holds.Settlement{RunID: a.Hold.RunID, Source: holds.SourceComplete}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRunSettledEarlierInItsBatchRefusesItsNextCall: a named run's settlement and its next
// call's admission share a batch, the settlement first. The admission must see the run settled,
// as it would in a batch of its own after the settlement: handed the run's hold as live, the
// call was forwarded on a settled run, whose later settlement charges nothing.
func TestRunSettledEarlierInItsBatchRefusesItsNextCall(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	call := holds.AdmitRequest{RunID: "x_closing", UserID: f.user.ID, ClientRunID: "closing", State: holds.StateRunning, TTL: time.Hour}
	if _, err := f.store.Admit(ctx, call); err != nil {
		t.Fatal(err)
	}
	settled, admitted, err := f.store.WriteBatch(ctx,
		[]holds.Settlement{{RunID: call.RunID, UserID: f.user.ID, CostMicro: 3_000, Source: holds.SourceClient}}, []holds.AdmitRequest{call})
	if err != nil {
		t.Fatal(err)
	}
	if s := settled[0]; s.Err != nil || !s.Applied || s.ChargedMicro != 3_000 {
		t.Fatalf("settlement: %+v", s)
	}
	if a := admitted[0]; !errors.Is(a.Err, holds.ErrRunSettled) {
		t.Errorf("next call of the run settled earlier in its batch: %+v, %v; want ErrRunSettled", a.Hold, a.Err)
	}
}
