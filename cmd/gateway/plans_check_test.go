package main

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/plans"
)

// TestServeWarnsOfUsersOnUnconfiguredPlans: a plans section replaces the demo plans, so a
// config that wrote only standard drops guest, and guest's users are served on default_plan's
// terms (standard's 2000 credits a day, not guest's 100) without a word. serve names each such
// plan and its users at start, and says nothing when every user's plan is configured.
func TestServeWarnsOfUsersOnUnconfiguredPlans(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	db := openTestDatabase(t)
	cfg := config.Default()
	st := holds.NewStore(db, plans.FromConfig(cfg), cfg.DefaultPlan, zap.NewNop())
	for _, u := range [][2]string{{"ann", "standard"}, {"gus", "guest"}, {"gia", "guest"}} {
		if _, err := st.CreateUser(ctx, u[0], u[1]); err != nil {
			t.Fatal(err)
		}
	}
	core, logs := observer.New(zapcore.WarnLevel)
	warnUsersOnUnconfiguredPlans(ctx, st, cfg, zap.New(core))
	if logs.Len() != 0 {
		t.Fatalf("every plan configured: logged %v, want nothing", logs.All())
	}

	onlyStandard := config.Default()
	delete(onlyStandard.Plans, "guest")
	warnUsersOnUnconfiguredPlans(ctx, st, onlyStandard, zap.New(core))
	if logs.Len() != 1 {
		t.Fatalf("guest not configured: logged %v, want one warning", logs.All())
	}
	f := logs.All()[0].ContextMap()
	if f["plan"] != "guest" || f["users"] != int64(2) || f["default_plan"] != "standard" {
		t.Errorf("warning fields %v, want plan guest, users 2, default_plan standard", f)
	}
}

// TestServeWarnsOfPlansThatDifferOnlyInCase: a plan's name is looked up as written, so users
// whose rows say "Guest" get default_plan's terms when the config has only "guest" (a config
// that renamed it so). users.plan compares without case: grouped by it, their rows were counted
// under "guest", a configured plan, and went unnamed.
func TestServeWarnsOfPlansThatDifferOnlyInCase(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	db := openTestDatabase(t)
	cfg := config.Default()
	st := holds.NewStore(db, plans.FromConfig(cfg), cfg.DefaultPlan, zap.NewNop())
	for _, name := range []string{"gus", "gia"} {
		if _, err := st.CreateUser(ctx, name, "guest"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, "UPDATE users SET plan = 'Guest' WHERE name = 'gia'"); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	warnUsersOnUnconfiguredPlans(ctx, st, cfg, zap.New(core))
	if logs.Len() != 1 {
		t.Fatalf("one user on Guest, which is not configured: logged %v, want one warning", logs.All())
	}
	if f := logs.All()[0].ContextMap(); f["plan"] != "Guest" || f["users"] != int64(1) {
		t.Errorf("warning fields %v, want plan Guest, users 1", f)
	}
}
