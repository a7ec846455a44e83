package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPauseRefundIsPaidOncePerRun: a run of one call charged its hold by another process
// (reconcile_hold) is refunded once, whichever settlements of its call find it settled and in
// whatever order: the refund of a call never forwarded (released at 0) and that of one forwarded
// (settled at what it used) share the run's grant key, whose first grant is the only one paid.
// Its grant's reason says which it was, and of a call forwarded whether its upstream refused it
// (it answered nothing). Mutants: a key of its own per case (the run refunded 20 000 and
// 19 800 µUSD more); one reason for both; a refusal's reason that of a call that used less.
func TestPauseRefundIsPaidOncePerRun(t *testing.T) {
	db, st, s := pauseRefundServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	released := holds.Settlement{Source: holds.SourceRelease}
	used := holds.Settlement{Source: holds.SourceComplete, CostMicro: 200}
	refusedUpstream := holds.Settlement{Source: holds.SourceUpstreamError}
	for _, tc := range []struct {
		name   string
		order  []holds.Settlement
		want   int64
		reason string // the first refund's, as the operator's listing of grants shows it
	}{
		{"never forwarded, then forwarded", []holds.Settlement{released, used}, 20_000, unforwardedRefundReason},
		{"forwarded, then never forwarded", []holds.Settlement{used, released}, 19_800, usedRefundReason},
		{"forwarded, sent again", []holds.Settlement{used, used}, 19_800, usedRefundReason},
		{"forwarded, refused by its upstream", []holds.Settlement{refusedUpstream}, 20_000, upstreamRefusedRefundReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := st.CreateUser(ctx, "pause-refund-"+testenv.RandomID(4), "standard")
			if err != nil {
				t.Fatal(err)
			}
			runID := "r_" + testenv.RandomID(16)
			if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Settle(ctx, holds.Settlement{RunID: runID, UserID: u.ID, Source: holds.SourceReconcileHold, ChargeHeld: true}); err != nil {
				t.Fatal(err)
			}
			c := &call{user: u, runID: runID, log: zap.NewNop()}
			for _, set := range tc.order {
				set.RunID, set.UserID = runID, u.ID
				s.refundPausedCharge(ctx, c, set)
			}
			var n int
			var granted int64
			var reason string
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(amount_micro), 0), COALESCE(MAX(reason), '') FROM grants WHERE user_id = ?",
				u.ID).Scan(&n, &granted, &reason); err != nil {
				t.Fatal(err)
			}
			if n != 1 || granted != tc.want || reason != tc.reason {
				t.Errorf("%d grants of %d µUSD in all (reason %q), want one of %d (reason %q)", n, granted, reason, tc.want, tc.reason)
			}
		})
	}
}

// TestPauseRefundOfAReleaseIsOfItsOwnHoldOnly: a refused admission's release that found its run
// charged its hold (reconcile_hold) gives the charge back only when the hold carries that
// admission's token (refundUnforwardedHold): a hold another request inserted on the run (an
// Idempotency-Key attempt's run is its key's) may have been forwarded. Mutants: the token not
// compared (the other request's hold refunded whole); the refund's reason that of a call forwarded.
func TestPauseRefundOfAReleaseIsOfItsOwnHoldOnly(t *testing.T) {
	db, st, s := pauseRefundServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := st.CreateUser(ctx, "pause-refund-token-"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	ar := holds.AdmitRequest{RunID: "r_" + testenv.RandomID(16), UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning,
		TTL: time.Minute, Token: "theirs"}
	if _, err := st.Admit(ctx, ar); err != nil {
		t.Fatal(err)
	}
	res, err := st.Settle(ctx, holds.Settlement{RunID: ar.RunID, UserID: u.ID, Source: holds.SourceReconcileHold, ChargeHeld: true})
	if err != nil || !res.Applied {
		t.Fatalf("settle as the reconciler would: %+v %v", res, err)
	}
	granted := func() (n int, sum int64) {
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(amount_micro), 0) FROM grants WHERE user_id = ?", u.ID).Scan(&n, &sum); err != nil {
			t.Fatal(err)
		}
		return n, sum
	}
	mine := ar
	mine.Token = "mine"
	s.refundUnforwardedHold(ctx, mine, zap.NewNop())
	if n, sum := granted(); n != 0 {
		t.Fatalf("%d grants of %d µUSD for a hold another admission inserted; want none", n, sum)
	}
	s.refundUnforwardedHold(ctx, ar, zap.NewNop())
	if n, sum := granted(); n != 1 || sum != res.ChargedMicro {
		t.Errorf("%d grants of %d µUSD for the refused admission's own hold; want one of %d", n, sum, res.ChargedMicro)
	}
	var reason string
	if err := db.QueryRowContext(ctx, "SELECT reason FROM grants WHERE user_id = ?", u.ID).Scan(&reason); err != nil || reason != unforwardedRefundReason {
		t.Errorf("the refund's reason %q (%v), want %q: nothing was forwarded on the hold", reason, err, unforwardedRefundReason)
	}
}

// pauseRefundServer is a Server on the test database with a store of one plan, whose holds are
// 20 000 µUSD, for calling its refunds directly.
func pauseRefundServer(t *testing.T) (*sqlx.DB, *holds.Store, *Server) {
	db := testenv.MySQL(t)
	plans := map[string]holds.Plan{"standard": {AllowanceMicro: 1_000_000, HoldNormalMicro: 20_000, HoldHeavyMicro: 20_000,
		HeavyAfterTurns: 4, MaxInFlight: 3, MaxRunCostMicro: 500_000}}
	st := holds.NewStore(db, plans, "standard", zap.NewNop())
	return db, st, &Server{store: st, cfg: config.Default()}
}

// TestPauseRefundIsOfReconcileHoldAlone: a call whose own settlement finds its run settled by
// another process gets nothing back unless that settlement charged what the hold held
// (reconcile_hold): a reconciler's settlement from the run's tally (reconcile) charged what
// the call's tally said it used, a call that was made, and stands whatever the call's own
// figures now say. Mutant: the source not compared (4 800 µUSD granted of a 5 000 µUSD
// charge from the tally).
func TestPauseRefundIsOfReconcileHoldAlone(t *testing.T) {
	db, st, s := pauseRefundServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := st.CreateUser(ctx, "pause-refund-tally-"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	runID := "r_" + testenv.RandomID(16)
	if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
		t.Fatal(err)
	}
	res, err := st.Settle(ctx, holds.Settlement{RunID: runID, UserID: u.ID, Source: holds.SourceReconcile, Calls: 1, CostMicro: 5_000})
	if err != nil || !res.Applied || res.ChargedMicro != 5_000 {
		t.Fatalf("settle from the tally as the reconciler would: %+v %v", res, err)
	}
	c := &call{user: u, runID: runID, log: zap.NewNop()}
	s.refundPausedCharge(ctx, c, holds.Settlement{RunID: runID, UserID: u.ID, Source: holds.SourceComplete, Calls: 1, CostMicro: 200})
	var n int
	var granted int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(amount_micro), 0) FROM grants WHERE user_id = ?", u.ID).Scan(&n, &granted); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d grants of %d µUSD for a run the reconciler settled from its tally; want none", n, granted)
	}
}
