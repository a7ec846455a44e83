package holds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestBatchSettlingAnExpiredHoldFreesNoSlot: a hold past its expiry no longer counts in flight,
// so settling it (the reconciler's settlement, sharing a Writer batch with admissions) frees no
// in-flight slot for an admission later in the batch; a batch that took one off the count let
// the user past the in-flight limit.
func TestBatchSettlingAnExpiredHoldFreesNoSlot(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	inFlight := 2
	f.setMaxInFlight(inFlight)
	old := f.admit("r_expired")
	f.expire(old.RunID)
	live := []string{"r_live_1", "r_live_2"}
	for _, id := range live {
		f.admit(id)
	}
	settled, admitted, err := f.store.WriteBatch(ctx,
		[]holds.Settlement{{RunID: old.RunID, Source: holds.SourceReconcileHold, ChargeHeld: true, OnlyIfExpired: true}},
		[]holds.AdmitRequest{{RunID: "r_one_too_many", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}})
	if err != nil {
		t.Fatal(err)
	}
	if s := settled[0]; s.Err != nil || !s.Applied {
		t.Fatalf("settlement of the expired hold: %+v", s)
	}
	var busy *holds.TooManyInFlightError
	if a := admitted[0]; !errors.As(a.Err, &busy) {
		t.Errorf("admission with %d unexpired holds in flight (limit %d), beside the settlement of an expired one: %+v, %v; want TooManyInFlightError",
			len(live), inFlight, a.Hold, a.Err)
		if a.Err == nil {
			live = append(live, a.Hold.RunID)
		}
	}
	for _, id := range live {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSettlementNamingAnotherUserIsNotFound: a settlement that names its user (as the proxy's
// do, to save a lookup) settles only a hold of that user. Another user's hold is not found and
// left live: the batch locked the named user, not the hold's, and would have charged the
// hold's user by the other user's plan and ledger.
func TestSettlementNamingAnotherUserIsNotFound(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	other, err := f.store.CreateUser(ctx, "other-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	h := f.admit("r_owned")
	res, err := f.store.SettleBatch(ctx, []holds.Settlement{{RunID: h.RunID, UserID: other.ID, CostMicro: 5_000, Source: holds.SourceComplete}})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; !errors.Is(r.Err, holds.ErrRunNotFound) || r.Applied {
		t.Errorf("settlement of user %d's run naming user %d: %+v; want ErrRunNotFound", f.user.ID, other.ID, r)
	}
	if run, err := f.store.Run(ctx, f.user.ID, h.RunID); err != nil || run.State == holds.StateSettled {
		t.Errorf("run after another user's settlement: %+v, %v; want it live", run, err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: h.RunID, UserID: f.user.ID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
