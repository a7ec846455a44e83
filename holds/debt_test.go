package holds_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// A user whose calls cost more than their balance owes the difference (prepaid below zero):
// their next admission is refused as insufficient, saying how much is owed, and the debt stays
// until a grant pays it — the allowance of a day does not. A user with nothing available and
// no debt is refused plainly.
func TestAUserInDebtIsRefusedSayingWhatIsOwed(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("overdrawn", "standard")
	hs := []holds.Hold{f.admit(u, "r_debt_1"), f.admit(u, "r_debt_2")}
	if err := f.store.SetUserLimits(f.ctx(), u.ID, ptr[int64](0), nil, nil); err != nil {
		t.Fatal(err)
	}
	var owed int64
	for _, h := range hs {
		owed += f.settle(h.RunID, h.HeldMicro).ChargedMicro
	}
	admit := func(runID string) error {
		_, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt",
			State: holds.StateRunning, TTL: time.Minute})
		return err
	}
	err := admit("r_debt_3")
	var debt *holds.InDebtError
	if !errors.As(err, &debt) || !errors.Is(err, holds.ErrInsufficient) || debt.DebtMicro != owed {
		t.Fatalf("admission in debt: %v (%+v), want InDebtError of %d wrapping ErrInsufficient", err, debt, owed)
	}

	// An allowance smaller than the debt leaves the user refused, and owing as much.
	if err := f.store.SetUserLimits(f.ctx(), u.ID, ptr(owed-1), nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := admit("r_debt_4"); !errors.As(err, &debt) || debt.DebtMicro != owed {
		t.Fatalf("admission in debt with allowance %d: %v, want InDebtError of %d", owed-1, err, owed)
	}

	// A grant pays the debt first; what it credits past it is available.
	f.grant(u, owed+1, "pay_debt")
	if err := admit("r_debt_5"); err != nil {
		t.Fatalf("admission once the debt is paid: %v", err)
	}
	if p := f.prepaid(u); p != 1 {
		t.Fatalf("prepaid %d after paying the debt, want 1", p)
	}

	plain := f.user("spent", "standard")
	if err := f.store.SetUserLimits(f.ctx(), plain.ID, ptr[int64](0), nil, nil); err != nil {
		t.Fatal(err)
	}
	_, err = f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: "r_spent_1", UserID: plain.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Minute})
	if !errors.Is(err, holds.ErrInsufficient) || errors.As(err, &debt) {
		t.Fatalf("admission with nothing available and no debt: %v, want plain ErrInsufficient", err)
	}
}
