package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/internal/testenv"
)

// plansConfig writes a config file with the default plans but standard's daily allowance.
func plansConfig(t *testing.T, standardAllowance string) string {
	t.Helper()
	plan := func(allowance string) string {
		return "    allowance_credits: " + allowance + "\n    hold_normal_credits: 20\n    hold_heavy_credits: 60\n" +
			"    heavy_after_turns: 4\n    max_in_flight: 3\n    max_run_cost_credits: 500\n"
	}
	path := filepath.Join(t.TempDir(), "plans.yaml")
	body := "default_plan: standard\nplans:\n  standard:\n" + plan(standardAllowance) + "  guest:\n" + plan("100")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestReconcileOnceRefusesAnotherConfigsPlans: the operator's commands took the plans from
// their own config, and nothing checked them against the fleet's: `reconcile -once` given a
// copy of the config from before standard's allowance was cut from 5000 to 2000 credits split
// a 3000-credit charge all to the day's allowance, where the gateways take 1000 of it from
// prepaid credits, and `balance` showed the old allowance. The commands that use plan terms
// now refuse plans other than those the fleet's gateways recorded, naming the first that
// differs and -config, before they write or print anything; with the fleet's config the charge
// is split as the gateways split it, and commands that use no plan terms run with any config.
func TestReconcileOnceRefusesAnotherConfigsPlans(t *testing.T) {
	count := useTestDatabase(t) // the fleet serves the default plans: standard has 2000 a day
	useTestRedis(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := stdout(t, func() error { return grantCmd(ctx, []string{"-user", "alice", "-amount", "5000", "-key", "pay-1"}) }); err != nil {
		t.Fatal(err)
	}
	// A call of a gateway that died: no lease, no tally, so the pass charges what it held.
	if _, err := openTestDatabase(t).ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at)
		SELECT 'r_1', id, 'running', 3000000, 3000000, 'm', NOW(6) - INTERVAL 1 HOUR FROM users`); err != nil {
		t.Fatal(err)
	}
	stale := plansConfig(t, "5000")

	refusedEach(t, ctx, []operatorCommand{
		{"reconcile -once", reconcileOnce, []string{"-once"}},
		{"balance", balanceCmd, []string{"-user", "alice"}},
		{"user show", userShow, []string{"-name", "alice"}},
		{"user list", userList, nil},
		{"user set", userSet, []string{"-name", "alice", "-max-in-flight", "5"}},
		{"grant", grantCmd, []string{"-user", "alice", "-amount", "-1", "-key", "refund-1"}},
	}, []string{"-config", stale}, "with a stale plans section",
		`plan "standard" has allowance_micro 5000000 in this config, 2000000 in the fleet's`)
	if n := count("SELECT COUNT(*) FROM run_holds WHERE state = 'settled'"); n != 0 {
		t.Fatalf("%d holds settled by a command with stale plans, want none", n)
	}
	if n := count("SELECT prepaid_micro FROM users"); n != 5_000_000 {
		t.Errorf("prepaid %d after commands with stale plans, want 5000000 untouched", n)
	}
	if n := count("SELECT COUNT(*) FROM grants"); n != 1 {
		t.Errorf("%d grants, want the first alone", n)
	}
	if n := count("SELECT COUNT(*) FROM users WHERE max_in_flight IS NOT NULL"); n != 0 {
		t.Errorf("user set with stale plans changed alice")
	}

	// Commands that use no plan terms run with the stale config.
	for name, cmd := range map[string]func(context.Context, []string) error{"runs": runsCmd, "report": reportCmd, "key list": keyList, "audit": auditCmd} {
		args := []string{"-config", stale}
		if name == "key list" {
			args = append(args, "-user", "alice")
		}
		if _, err := stdout(t, func() error { return cmd(ctx, args) }); err != nil {
			t.Errorf("%s with another config's plans: %v", name, err)
		}
	}

	// The fleet's plans (the default config's): 2000 from the day's allowance, 1000 prepaid.
	if _, err := stdout(t, func() error { return reconcileOnce(ctx, []string{"-once"}) }); err != nil {
		t.Fatalf("reconcile -once with the fleet's plans: %v", err)
	}
	if n := count("SELECT allowance_part_micro FROM run_holds WHERE run_id = 'r_1' AND state = 'settled'"); n != 2_000_000 {
		t.Errorf("allowance part %d, want 2000000 (standard's allowance)", n)
	}
	if n := count("SELECT prepaid_micro FROM users"); n != 4_000_000 {
		t.Errorf("prepaid %d after the charge, want 4000000", n)
	}
	out, err := stdout(t, func() error { return balanceCmd(ctx, []string{"-user", "alice"}) })
	var b struct{ Allowance json.Number }
	if err != nil || json.Unmarshal(out, &b) != nil || b.Allowance != "2000" {
		t.Errorf("balance with the fleet's plans: %s, %v; want allowance 2000", out, err)
	}
}

// TestCommandsThatUsePlansRefuseWhileNoneAreRecorded: on a database no gateway of this
// version has served (one just migrated while the old gateways serve on), the fleet's plans
// are unknown, as its credit_micro would be; balance is refused, saying to start the gateway,
// and a command that uses no plan terms runs.
func TestCommandsThatUsePlansRefuseWhileNoneAreRecorded(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := openTestDatabase(t).ExecContext(ctx, "DELETE FROM plan_terms"); err != nil {
		t.Fatal(err)
	}
	_, err := stdout(t, func() error { return balanceCmd(ctx, []string{"-user", "alice"}) })
	if !errors.Is(err, holds.ErrNoPlanTerms) || !strings.Contains(err.Error(), "gateway serve") {
		t.Errorf("balance with no plan terms recorded: %v, want holds.ErrNoPlanTerms saying to start `gateway serve`", err)
	}
	if _, err := stdout(t, func() error { return runsCmd(ctx, nil) }); err != nil {
		t.Errorf("runs with no plan terms recorded: %v", err)
	}
}

// TestServeRecordsItsPlanTermsAndAChangedOne: a serve records the plan terms it serves by; a
// serve of the same terms says nothing; one with other plans (a new plan, an allowance raised:
// the routine way plans change) is not refused, records its terms in place of the old, and
// warns, with every change and the terms before and after.
func TestServeRecordsItsPlanTermsAndAChangedOne(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	db := openTestDatabase(t)
	if _, err := db.ExecContext(ctx, "DELETE FROM plan_terms"); err != nil {
		t.Fatal(err)
	}
	// `gateway serve` itself records them, before it serves.
	t.Setenv("LISTEN_ADDR", "127.0.0.1:0")
	t.Setenv("REDIS_URL", testenv.RedisURL(t))
	_, prefix := testenv.Redis(t)
	t.Setenv("TOLLGATE_REDIS_PREFIX", prefix)
	t.Setenv("TOLLGATE_INSTANCE", "gw-serve")
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- serve(sctx, func() {}, nil) }()
	// It registers its instance row after: poll for that row, or for serve to end.
	for count("SELECT COUNT(*) FROM instances WHERE name = 'gw-serve'") == 0 {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("serve ended before it registered: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	// What serve returns once stopped is not this test's: the row can be seen before its
	// insert's reply has come back, and a serve stopped in that moment ends with the
	// cancellation (or the connection it cut), which says nothing of what it recorded.
	cancel()
	<-done
	if n := count("SELECT COUNT(*) FROM plan_terms WHERE set_by = 'gw-serve'"); n != 1 {
		t.Fatalf("serve registered without recording its plan terms")
	}

	cfg := config.Default()
	st := holds.NewStore(db, plans.FromConfig(cfg), cfg.DefaultPlan, zap.NewNop())
	if err := st.CheckPlanTerms(ctx); err != nil {
		t.Fatalf("check of the default config's plans after serve recorded them: %v", err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	if err := recordPlanTerms(ctx, st, cfg, zap.New(core)); err != nil || logs.Len() != 0 {
		t.Fatalf("serve of the same plans: %v, logged %v; want nothing", err, logs.All())
	}

	changed := config.Default()
	changed.Instance = "gw-new"
	p := changed.Plans["standard"]
	p.AllowanceCredits = config.CreditsOf(3000)
	changed.Plans["standard"] = p
	changed.Plans["pro"] = p
	newer := holds.NewStore(db, plans.FromConfig(changed), changed.DefaultPlan, zap.NewNop())
	if err := recordPlanTerms(ctx, newer, changed, zap.New(core)); err != nil {
		t.Fatalf("serve with a plan added and an allowance raised: %v, want it served", err)
	}
	if n := count("SELECT COUNT(*) FROM plan_terms WHERE set_by = 'gw-new'"); n != 1 {
		t.Errorf("plan terms not recorded by the changed serve")
	}
	if err := newer.CheckPlanTerms(ctx); err != nil {
		t.Errorf("check of the changed plans after they were recorded: %v", err)
	}
	warned := logs.FilterMessageSnippet("plan terms changed").All()
	if len(warned) != 1 || warned[0].Level != zapcore.WarnLevel {
		t.Fatalf("logged %v, want one warning of the change", logs.All())
	}
	f := warned[0].ContextMap()
	want := []any{`plan "pro" added`, `plan "standard" allowance_micro 2000000 -> 3000000`}
	if ch, _ := f["changes"].([]any); len(ch) != 2 || ch[0] != want[0] || ch[1] != want[1] || f["previous_set_by"] != "gw-serve" {
		t.Errorf("warning fields %v, want changes %v and previous_set_by gw-serve", f, want)
	}
	prev, _ := f["previous_plan_terms"].(holds.PlanTerms)
	now, _ := f["plan_terms"].(holds.PlanTerms)
	if prev.Plans["standard"]["allowance_micro"] != 2_000_000 || now.Plans["standard"]["allowance_micro"] != 3_000_000 {
		t.Errorf("warning's terms before %v and after %v, want standard's allowance 2000000 then 3000000", prev, now)
	}
}

// TestUserDisableRunsWithAnyConfig: disabling a user is what an operator may need at once —
// an abusive caller mid-upgrade, before a new gateway has recorded anything, or mid-rollout of
// new plans, with the old file at hand. user disable and enable were refused then, for the
// credits and plan terms they printed; they print neither now, and run with any config.
func TestUserDisableRunsWithAnyConfig(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		how  string
		args []string
	}{{"nothing recorded", nil}, {"another credit_micro than recorded", []string{"-config", fleetConfig(t, "5000")}}} {
		if c.args != nil {
			servedAt(t, openTestDatabase(t), 10_000)
		}
		for _, cmd := range []struct {
			name     string
			run      func(context.Context, []string) error
			disabled bool
		}{{"user disable", userDisable, true}, {"user enable", userEnable, false}} {
			raw, err := stdout(t, func() error { return cmd.run(ctx, append(slices.Clone(c.args), "-name", "alice")) })
			if err != nil {
				t.Fatalf("%s with %s: %v", cmd.name, c.how, err)
			}
			var out map[string]any
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("%s: %v in %s", cmd.name, err, raw)
			}
			if out["disabled"] != cmd.disabled || out["changed"] != true {
				t.Errorf("%s with %s printed %s", cmd.name, c.how, raw)
			}
			for _, figure := range []string{"prepaid", "effective", "overrides"} {
				if _, ok := out[figure]; ok {
					t.Errorf("%s with %s printed %q, read by a config that may not be the fleet's: %s", cmd.name, c.how, figure, raw)
				}
			}
		}
	}
}
