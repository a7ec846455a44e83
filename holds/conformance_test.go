package holds_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestExpiredHoldsNoLongerCountAtAdmission: DESIGN §3 counts in flight the user's
// queued/running holds whose expires_at is still in the future (database time): a hold left
// by a dead process stops blocking its user's slot when it expires, before the reconciler
// settles it. What it held still counts against the balance until then (DESIGN §2 counts only
// unexpired holds; that let the next admissions spend credits the reconciler then charged
// again, past §3's overdraft bound: TestExpiredUnsettledHoldCountsAgainstBalance).
func TestExpiredHoldsNoLongerCountAtAdmission(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("expired-holds", 3, nil)
	var ids []string
	for _, id := range []string{"r_exp_a", "r_exp_b", "r_exp_c"} {
		ids = append(ids, e.admit(u, id, holds.StateRunning).RunID)
	}
	_, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_exp_d", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour})
	var busy *holds.TooManyInFlightError
	if !errors.As(err, &busy) {
		t.Fatalf("fourth admission with three live holds: %v, want too many in flight", err)
	}
	e.expire(ids[0])
	b, err := e.store.Balance(e.ctx(), u.ID)
	if err != nil || b.InFlight != 2 || b.HeldMicro != 3*testHoldNormal || b.AvailableMicro != testAllowance-3*testHoldNormal {
		t.Fatalf("balance with one hold expired: %+v, %v; want 2 in flight, holding %d (the expired hold is still owed)", b, err, 3*testHoldNormal)
	}
	if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_exp_d", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour}); err != nil {
		t.Fatalf("admission once a hold expired: %v", err)
	}
	for _, id := range append(ids, "r_exp_d") {
		if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOverdraftIsDebtUntilPaidOrCoveredByTomorrow: DESIGN §2 — a charge larger than what is
// left takes prepaid_micro below zero; that debt is real, and the next admission sees
// available ≤ 0 until it is paid (a grant) or the next day's allowance covers it.
func TestOverdraftIsDebtUntilPaidOrCoveredByTomorrow(t *testing.T) {
	// One day's allowance pays both charges, and "the next day" is the one the rows are moved
	// back from: the database's day must not turn on its own in between.
	e := newStoreEnvMidday(t)
	u := e.user("debtor", 3, nil)
	allowance := int64(100_000)
	if err := e.store.SetUserLimits(e.ctx(), u.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	admit := func(id string) (holds.Hold, error) {
		return e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: "fake-gpt",
			State: holds.StateRunning, TTL: time.Hour})
	}
	a, err := admit("r_debt_a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := admit("r_debt_b") // admitted against what a's hold left: cap 80 000
	if err != nil || b.CapMicro != 80_000 {
		t.Fatalf("second admission: %+v, %v; want a cap of 80 000", b, err)
	}
	// Both calls run past their holds, each clamped to its cap: 180 000 against 100 000.
	for _, h := range []holds.Hold{a, b} {
		if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: h.RunID, CostMicro: 1_000_000, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	bal, err := testenv.BalanceAllDays(e.ctx(), e.store, u.ID)
	if err != nil || bal.PrepaidMicro != -80_000 || bal.AvailableMicro != -80_000 {
		t.Fatalf("after the overdraft: %+v, %v; want prepaid and available at -80 000", bal, err)
	}
	if _, err := admit("r_debt_c"); !errors.Is(err, holds.ErrInsufficient) {
		t.Fatalf("admission in debt: %v, want insufficient", err)
	}
	if _, _, err := e.store.Grant(e.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 50_000, IdempotencyKey: "debt-part"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admit("r_debt_c"); !errors.Is(err, holds.ErrInsufficient) {
		t.Fatalf("admission with part of the debt paid: %v, want insufficient", err)
	}
	// The next UTC day: its allowance first covers what is still owed.
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE usage_days SET day = day - INTERVAL 1 DAY WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET settled_at = settled_at - INTERVAL 1 DAY WHERE user_id = ? AND state = 'settled'", u.ID); err != nil {
		t.Fatal(err)
	}
	c, err := admit("r_debt_c")
	if err != nil || c.HeldMicro != 20_000 || c.CapMicro != 70_000 {
		t.Fatalf("next day's admission: %+v, %v; want hold 20 000 and cap 70 000 (100 000 allowance less 30 000 owed)", c, err)
	}
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: c.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
