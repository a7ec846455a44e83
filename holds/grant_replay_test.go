package holds_test

import (
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestRefundRetriedAfterItLandedIsReplayed: a refund that took the prepaid balance to zero,
// sent again with its key (the admin script's retry after a lost reply), is the refund that
// landed, answered as a replay: read inside the grant's transaction, before the balance
// check, the key finds it. Were the balance checked first, the retry would be refused as
// going below zero, and the script would report a refund that had been made as failed (no
// test failed when that lookup found nothing).
func TestRefundRetriedAfterItLandedIsReplayed(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("rhea", "standard")
	req := func(amount int64, key string) holds.GrantRequest {
		return holds.GrantRequest{UserID: u.ID, AmountMicro: amount, IdempotencyKey: key, Reason: "test"}
	}
	if _, _, err := f.store.Grant(f.ctx(), req(5_000_000, "pay-1")); err != nil {
		t.Fatal(err)
	}
	first, created, err := f.store.Grant(f.ctx(), req(-5_000_000, "refund-1"))
	if err != nil || !created || first.BalanceAfterMicro != 0 {
		t.Fatalf("refund: %+v created=%v %v, want applied down to 0", first, created, err)
	}
	again, created, err := f.store.Grant(f.ctx(), req(-5_000_000, "refund-1"))
	if err != nil {
		t.Fatalf("refund retried after it landed: %v, want the refund replayed", err)
	}
	if created || again.ID != first.ID {
		t.Fatalf("retry: grant %d created=%v, want grant %d replayed", again.ID, created, first.ID)
	}
	b, err := f.store.Balance(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.PrepaidMicro != 0 {
		t.Fatalf("prepaid %d after one refund of the whole payment, want 0", b.PrepaidMicro)
	}
}
