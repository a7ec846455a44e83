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

// TestRevivedRunCountsAgainstLimits: a named run whose hold expired stops counting at
// admission; other calls are admitted against what it held. A later call of the run pushes
// its expiry out again (d6ceae0) — it must not bring back a hold the balance and the in-flight
// limit no longer cover.
func TestRevivedRunCountsAgainstLimits(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	allowance, inFlight := int64(40_000), 2
	if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, &inFlight, nil); err != nil {
		t.Fatal(err)
	}
	named := holds.AdmitRequest{RunID: "x_paused", UserID: f.user.ID, ClientRunID: "paused", State: holds.StateRunning, TTL: time.Hour}
	if h, err := f.store.Admit(ctx, named); err != nil || h.HeldMicro != 20_000 {
		t.Fatalf("first call of the run: %+v, %v", h, err)
	}
	if _, err := f.store.DB().ExecContext(ctx, "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = ?", named.RunID); err != nil {
		t.Fatal(err)
	}
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
