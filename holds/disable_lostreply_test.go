package holds_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestDisableUserLostReply: the server disables (then enables) a user but the reply is lost
// with the connection. The store retries the statement, which then changes nothing, and
// answered changed=false: the operator (the admin API's and `gateway user disable`'s
// "changed") was told the user had been disabled already, by someone else, while this very
// request had disabled it. The retry must answer what the request did.
func TestDisableUserLostReply(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	lossy.Arm("UPDATE users SET disabled_at = NOW(6)", testenv.LoseReply)
	changed, err := f.store.DisableUser(ctx, f.user.ID)
	if !lossy.Fired() {
		t.Fatal("the disable's reply was never lost")
	}
	if err != nil || !changed {
		t.Fatalf("disable whose reply was lost: changed=%v, %v; want changed", changed, err)
	}
	if u, err := f.store.UserByName(ctx, f.user.Name); err != nil || !u.Disabled {
		t.Fatalf("user %+v, %v: want disabled", u, err)
	}
	// Disabling a disabled user changes nothing, and says so.
	if changed, err := f.store.DisableUser(ctx, f.user.ID); err != nil || changed {
		t.Fatalf("second disable: changed=%v, %v; want unchanged", changed, err)
	}
	lossy.Arm("UPDATE users SET disabled_at = NULL", testenv.LoseReply)
	changed, err = f.store.EnableUser(ctx, f.user.ID)
	if !lossy.Fired() {
		t.Fatal("the enable's reply was never lost")
	}
	if err != nil || !changed {
		t.Fatalf("enable whose reply was lost: changed=%v, %v; want changed", changed, err)
	}
	if changed, err := f.store.EnableUser(ctx, f.user.ID); err != nil || changed {
		t.Fatalf("second enable: changed=%v, %v; want unchanged", changed, err)
	}
}
