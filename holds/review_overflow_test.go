package holds_test

import (
	"errors"
	"math"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// A refund so large that prepaid credits plus it pass below MinInt64 must be refused like any
// refund below zero. Computed in int64 the sum wraps to a huge positive balance: the debit of
// a user in debt came out as a credit of about MaxInt64. (The admin API parses amounts up to
// MaxInt64 micro-USD when credit_micro is 10^7.)
func TestHugeRefundToADebtorDoesNotWrapIntoACredit(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("debtor-wrap", "standard")
	if err := f.store.SetUserLimits(f.ctx(), u.ID, ptr[int64](100_000), nil, nil); err != nil {
		t.Fatal(err)
	}
	// Two calls in flight together, each run past its hold to its cap: 180 000 against
	// 100 000, so prepaid credits end at -80 000 (DESIGN §2's bounded overdraft).
	a, b := f.admit(u, "r_wrap_a"), f.admit(u, "r_wrap_b")
	for _, h := range []holds.Hold{a, b} {
		if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: h.RunID, CostMicro: 1_000_000, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	if p := f.prepaid(u); p != -80_000 {
		t.Fatalf("prepaid %d after the overdraft, want -80000", p)
	}
	g, created, err := f.store.Grant(f.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: -math.MaxInt64,
		IdempotencyKey: "refund-huge", Reason: "typo"})
	if !errors.Is(err, holds.ErrGrantBelowZero) {
		t.Errorf("refund of MaxInt64 to a debtor: %+v created=%v, %v; want %v", g, created, err, holds.ErrGrantBelowZero)
	}
	if p := f.prepaid(u); p != -80_000 {
		t.Fatalf("prepaid %d after the refused refund, want -80000 unchanged", p)
	}
}
