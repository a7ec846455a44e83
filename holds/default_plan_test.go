package holds_test

import (
	"context"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestUserCreatedWithoutAPlanGetsTheDefaultPlan: a user created without a plan (`gateway user
// create` without -plan, POST /admin/users without "plan") is on the store's default plan,
// the config's default_plan, not on a plan named "standard" whatever the config says.
func TestUserCreatedWithoutAPlanGetsTheDefaultPlan(t *testing.T) {
	db := testenv.MySQL(t)
	st := holds.NewStore(db, acctPlans(), "guest", zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	u, err := st.CreateUser(context.Background(), "nova", "")
	if err != nil {
		t.Fatal(err)
	}
	if u.Plan != "guest" {
		t.Fatalf("user created without a plan is on %q, want the default plan guest", u.Plan)
	}
}
