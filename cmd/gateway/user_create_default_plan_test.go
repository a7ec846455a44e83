package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/plans"
)

// TestUserCreateWithoutPlanGetsTheFleetsDefaultPlan: `user create` runs with any config, and a
// user created without -plan got the default_plan of the config at hand. Run without the fleet's
// -config (the built-in default_plan, standard) beside a fleet whose default_plan is guest (100
// credits a day) and which also serves standard (2000 a day), it put a new user on standard:
// the fleet then served them 2000 credits a day where it gives new users 100. A command whose
// default_plan is not the fleet's recorded one must refuse to pick the plan (naming -config and
// -plan) and write nothing; given -plan, or the fleet's config, it creates the user.
func TestUserCreateWithoutPlanGetsTheFleetsDefaultPlan(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	// The fleet: the built-in plans, but new users on guest.
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte("default_plan: guest\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fleet, err := config.LoadWithoutRedis(path)
	if err != nil {
		t.Fatal(err)
	}
	st := holds.NewStore(openTestDatabase(t), plans.FromConfig(fleet), fleet.DefaultPlan, zap.NewNop())
	if _, _, err := st.RecordPlanTerms(ctx, "test-fleet"); err != nil {
		t.Fatal(err)
	}

	err = userCreate(ctx, []string{"-name", "bob"})
	if err == nil || !strings.Contains(err.Error(), "-config") || !strings.Contains(err.Error(), "-plan") {
		plan := "<none>"
		if u, uerr := st.UserByName(ctx, "bob"); uerr == nil {
			plan = u.Plan
		}
		t.Fatalf("user create without -plan beside a fleet whose default_plan is guest: %v (bob's plan %s), want it refused naming -config and -plan", err, plan)
	}
	if n := count("SELECT COUNT(*) FROM users"); n != 0 {
		t.Fatalf("%d users written by the refused command", n)
	}
	if _, err := stdout(t, func() error { return userCreate(ctx, []string{"-name", "bob", "-config", path}) }); err != nil {
		t.Fatal(err)
	}
	if _, err := stdout(t, func() error { return userCreate(ctx, []string{"-name", "carol", "-plan", "standard"}) }); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"bob": "guest", "carol": "standard"} {
		if u, err := st.UserByName(ctx, name); err != nil || u.Plan != want {
			t.Errorf("%s: %+v %v, want plan %s", name, u, err, want)
		}
	}
}

// TestUserCreateRefusesAPlanTheFleetDoesNotServe: `user create -plan P` looked P up in its own
// config alone. Given a config with a plan pro (one drafted, not rolled out) beside a fleet that
// serves standard and guest, it put bob on pro and said so, while the gateways, which serve no
// pro, gave him default_plan's terms: another allowance and holds than the operator chose, with
// nothing to tell but a warning at the next gateway's start. A -plan the fleet's gateways
// recorded no terms for is refused (naming the plan, -config and the fleet's plans) and nothing
// is written; a plan they serve is created as before.
func TestUserCreateRefusesAPlanTheFleetDoesNotServe(t *testing.T) {
	count := useTestDatabase(t) // the fleet serves the default plans: standard and guest
	ctx := testCtx(t)
	plan := "    allowance_credits: 100\n    hold_normal_credits: 20\n    hold_heavy_credits: 60\n" +
		"    heavy_after_turns: 4\n    max_in_flight: 3\n    max_run_cost_credits: 500\n"
	drafted := filepath.Join(t.TempDir(), "drafted.yaml")
	body := "default_plan: standard\nplans:\n  standard:\n" + plan + "  guest:\n" + plan + "  pro:\n" + plan
	if err := os.WriteFile(drafted, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}

	_, err := stdout(t, func() error { return userCreate(ctx, []string{"-config", drafted, "-name", "bob", "-plan", "pro"}) })
	if err == nil || !strings.Contains(err.Error(), `"pro"`) || !strings.Contains(err.Error(), "-config") || !strings.Contains(err.Error(), "guest, standard") {
		t.Errorf("user create -plan pro beside a fleet that serves no pro: %v; want it refused naming pro, -config and the fleet's plans", err)
	}
	if n := count("SELECT COUNT(*) FROM users"); n != 0 {
		t.Fatalf("%d users written by the refused command", n)
	}
	if _, err := stdout(t, func() error { return userCreate(ctx, []string{"-config", drafted, "-name", "bob", "-plan", "guest"}) }); err != nil {
		t.Fatalf("user create -plan guest, a plan the fleet serves: %v", err)
	}
	if n := count("SELECT COUNT(*) FROM users WHERE name = 'bob' AND plan = 'guest'"); n != 1 {
		t.Errorf("bob not created on guest")
	}
}
