package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The money edges below each pin a piece of the admission and settlement arithmetic that no
// other deterministic test reaches: a prepaid part of one micro-USD, and two admissions of
// one user in one batch (only a storm's chance batching covered it).

// TestPrepaidPartOfOneMicroIsTakenFromPrepaid: a charge that passes the allowance by one
// micro-USD takes that one from prepaid credits, in the user's row as in the run's.
func TestPrepaidPartOfOneMicroIsTakenFromPrepaid(t *testing.T) {
	f := newAcctFixtureMidday(t)
	u := f.user("one-past", "standard")
	if err := f.store.SetUserLimits(f.ctx(), u.ID, ptr[int64](30_000), nil, nil); err != nil {
		t.Fatal(err)
	}
	f.grant(u, 100_000, "topup")
	f.admit(u, "r_one_past")
	out := f.settle("r_one_past", 30_001)
	if out.AllowancePart != 30_000 || out.PrepaidPart != 1 {
		t.Fatalf("settled %+v, want 30000 from allowance and 1 from prepaid", out)
	}
	if p := f.prepaid(u); p != 99_999 {
		t.Fatalf("prepaid %d after a prepaid part of 1, want 99999", p)
	}
}

// TestAdmissionsInOneBatchShareTheBalance: two admissions of one user in one batch are
// decided one after the other against one balance, the first's hold counted against the
// second, as separate transactions would count it. Counted each alone against the balance,
// both took the normal hold, and together they held more than the user had.
func TestAdmissionsInOneBatchShareTheBalance(t *testing.T) {
	f := newAcctFixtureMidday(t)
	u := f.user("two-in-one", "standard")
	if err := f.store.SetUserLimits(f.ctx(), u.ID, ptr[int64](30_000), nil, nil); err != nil {
		t.Fatal(err)
	}
	out, err := f.store.AdmitBatch(f.ctx(), []holds.AdmitRequest{
		{RunID: "r_first", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute, Fresh: true},
		{RunID: "r_second", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute, Fresh: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Err != nil || out[0].Hold.HeldMicro != 20_000 {
		t.Fatalf("first admission %+v, %v; want the normal hold of 20000", out[0].Hold, out[0].Err)
	}
	// 30000 allowance - 20000 held by the first: the second holds what is left.
	if out[1].Err != nil || out[1].Hold.HeldMicro != 10_000 || out[1].Hold.CapMicro != 10_000 {
		t.Fatalf("second admission %+v, %v; want a hold and cap of the 10000 left", out[1].Hold, out[1].Err)
	}
	b, err := testenv.BalanceAllDays(f.ctx(), f.store, u.ID)
	if err != nil || b.HeldMicro != 30_000 || b.AvailableMicro != 0 {
		t.Fatalf("balance %+v, %v; want 30000 held, nothing available", b, err)
	}
}
