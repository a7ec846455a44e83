package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// fleetConfig writes a config file whose credit_micro is creditMicro.
func fleetConfig(t *testing.T, creditMicro string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte("credit_micro: "+creditMicro+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// operatorCommand is one of the operator's commands as a test runs it, with its own flags.
type operatorCommand struct {
	name string
	cmd  func(context.Context, []string) error
	args []string
}

// refusedEach runs each of cmds with configArgs before its own flags, and fails the test
// unless each is refused naming every one of want and -config, having printed nothing; how
// says how they were run.
func refusedEach(t *testing.T, ctx context.Context, cmds []operatorCommand, configArgs []string, how string, want ...string) {
	t.Helper()
	for _, c := range cmds {
		out, err := stdout(t, func() error { return c.cmd(ctx, append(append([]string{}, configArgs...), c.args...)) })
		if err == nil || !strings.Contains(err.Error(), "-config") {
			t.Errorf("%s %s: %v, want it refused naming %q and -config", c.name, how, err, want)
		}
		for _, w := range want {
			if err != nil && !strings.Contains(err.Error(), w) {
				t.Errorf("%s %s: %v, want it refused naming %q", c.name, how, err, w)
			}
		}
		if len(out) != 0 {
			t.Errorf("%s refused printed %s", c.name, out)
		}
	}
}

// TestOperatorCommandsRefuseAnotherCreditMicro: credit_micro is a setting and the database
// holds micro-USD, so every operator command converted credits at its own config's value: run
// without the fleet's -config (the default 1000) against a fleet serving at 10000, `gateway
// grant -amount 5` credited 5000 micro-USD, half a credit of the fleet's, and `user set
// -allowance 5` gave a tenth of the allowance asked, both silently, while balances and reports
// showed figures ten times too large. Each command that converts credits now refuses a
// credit_micro other than the one the fleet's gateways recorded, naming both and -config,
// before it writes anything; with the fleet's config it runs as before.
func TestOperatorCommandsRefuseAnotherCreditMicro(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	servedAt(t, openTestDatabase(t), 10_000) // the fleet serves at 10000
	fleet := fleetConfig(t, "10000")
	stale := fleetConfig(t, "5000")

	cmds := []operatorCommand{
		{"grant", grantCmd, []string{"-user", "alice", "-amount", "5", "-key", "pay-1"}},
		{"user set", userSet, []string{"-name", "alice", "-allowance", "5"}},
		{"user show", userShow, []string{"-name", "alice"}},
		{"user list", userList, nil},
		{"balance", balanceCmd, []string{"-user", "alice"}},
		{"runs", runsCmd, nil},
		{"report", reportCmd, nil},
	}
	for _, cfg := range []struct {
		args  []string
		value string
	}{{nil, "1000"}, {[]string{"-config", stale}, "5000"}} {
		refusedEach(t, ctx, cmds, cfg.args, "at credit_micro "+cfg.value+" beside a fleet at 10000",
			"credit_micro is "+cfg.value, "credit_micro 10000")
	}
	if n := count("SELECT COUNT(*) FROM grants"); n != 0 {
		t.Errorf("%d grants written at another credit_micro, want none", n)
	}
	if n := count("SELECT COUNT(*) FROM users WHERE prepaid_micro <> 0 OR allowance_micro IS NOT NULL OR disabled_at IS NOT NULL"); n != 0 {
		t.Errorf("alice changed by commands at another credit_micro")
	}

	// The fleet's config: converted at 10000.
	out, err := stdout(t, func() error {
		return grantCmd(ctx, []string{"-config", fleet, "-user", "alice", "-amount", "5", "-key", "pay-1"})
	})
	if err != nil {
		t.Fatalf("grant with the fleet's config: %v", err)
	}
	var g struct{ Amount json.Number }
	if err := json.Unmarshal(out, &g); err != nil || g.Amount != "5" {
		t.Errorf("grant printed %s (%v), want amount 5", out, err)
	}
	if n := count("SELECT prepaid_micro FROM users WHERE name = 'alice'"); n != 50_000 {
		t.Errorf("prepaid %d micro-USD after a grant of 5 credits at 10000, want 50000", n)
	}
	if _, err := stdout(t, func() error {
		return userSet(ctx, []string{"-config", fleet, "-name", "alice", "-allowance", "5"})
	}); err != nil {
		t.Fatalf("user set with the fleet's config: %v", err)
	}
	if n := count("SELECT allowance_micro FROM users WHERE name = 'alice'"); n != 50_000 {
		t.Errorf("allowance %d micro-USD after -allowance 5 at 10000, want 50000", n)
	}
	out, err = stdout(t, func() error { return balanceCmd(ctx, []string{"-config", fleet, "-user", "alice"}) })
	var b struct{ Prepaid json.Number }
	if err != nil || json.Unmarshal(out, &b) != nil || b.Prepaid != "5" {
		t.Errorf("balance with the fleet's config: %s, %v; want prepaid 5", out, err)
	}

	// Commands that show no credits run with any config.
	if _, err := stdout(t, func() error { return keyList(ctx, []string{"-user", "alice"}) }); err != nil {
		t.Errorf("key list at the default credit_micro: %v", err)
	}
	if _, err := stdout(t, func() error { return auditCmd(ctx, nil) }); err != nil {
		t.Errorf("audit at the default credit_micro: %v", err)
	}
}

// TestOperatorCommandsRefuseWhileNoCreditMicroIsRecorded: on a database no gateway of this
// version has served (a fresh one, or one just migrated while the old gateways serve on), what
// a credit is worth is unknown; a grant is refused, saying to start the gateway, and writes
// nothing.
func TestOperatorCommandsRefuseWhileNoCreditMicroIsRecorded(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := openTestDatabase(t).ExecContext(ctx, "DELETE FROM credit_unit"); err != nil {
		t.Fatal(err)
	}
	_, err := stdout(t, func() error { return grantCmd(ctx, []string{"-user", "alice", "-amount", "5", "-key", "pay-1"}) })
	if !errors.Is(err, holds.ErrNoCreditUnit) || !strings.Contains(err.Error(), "gateway serve") {
		t.Errorf("grant with no credit_micro recorded: %v, want holds.ErrNoCreditUnit saying to start `gateway serve`", err)
	}
	if n := count("SELECT COUNT(*) FROM grants"); n != 0 {
		t.Errorf("%d grants written with no credit_micro recorded, want none", n)
	}
}

// TestServeRecordsItsCreditMicroAndRefusesAnother: the first gateway records the
// credit_micro it serves at; one started with another value is refused, naming both and
// -change-credit-micro, and leaves the record alone (beside the fleet it would admit by plan
// allowances and convert its admin API's credits at another rate); with -change-credit-micro
// its value is recorded, and the change logged.
func TestServeRecordsItsCreditMicroAndRefusesAnother(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	db := openTestDatabase(t)
	if _, err := db.ExecContext(ctx, "DELETE FROM credit_unit"); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.CreditMicro = 10_000
	st := holds.NewStore(db, map[string]holds.Plan{"standard": {}}, "standard", zap.NewNop())
	core, logs := observer.New(zapcore.InfoLevel)
	if err := recordCreditUnit(ctx, st, cfg, false, zap.New(core)); err != nil {
		t.Fatalf("first gateway: %v", err)
	}
	if err := recordCreditUnit(ctx, st, cfg, false, zap.New(core)); err != nil {
		t.Fatalf("second gateway at the same value: %v", err)
	}
	if n := count("SELECT credit_micro FROM credit_unit WHERE id = 1"); n != 10_000 {
		t.Fatalf("recorded %d, want 10000", n)
	}

	// `gateway serve` with the default config (1000) beside it. Were it not refused, it would
	// serve until sctx ends.
	t.Setenv("LISTEN_ADDR", "127.0.0.1:0")
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := serve(sctx, func() {}, nil)
	var mismatch *holds.CreditUnitMismatchError
	if !errors.As(err, &mismatch) || !strings.Contains(err.Error(), "-change-credit-micro") ||
		!strings.Contains(err.Error(), "credit_micro is 1000") || !strings.Contains(err.Error(), "credit_micro 10000") {
		t.Fatalf("serve at 1000 beside a fleet at 10000: %v, want it refused naming both and -change-credit-micro", err)
	}
	if n := count("SELECT credit_micro FROM credit_unit WHERE id = 1"); n != 10_000 {
		t.Fatalf("recorded %d after a refused serve, want 10000 still", n)
	}

	cfg.CreditMicro = 1000
	if err := recordCreditUnit(ctx, st, cfg, true, zap.New(core)); err != nil {
		t.Fatalf("deliberate change: %v", err)
	}
	if n := count("SELECT credit_micro FROM credit_unit WHERE id = 1"); n != 1000 {
		t.Fatalf("recorded %d after -change-credit-micro, want 1000", n)
	}
	changed := logs.FilterMessageSnippet("credit_micro changed").All()
	if len(changed) != 1 || changed[0].ContextMap()["previous_credit_micro"] != int64(10_000) || changed[0].ContextMap()["credit_micro"] != int64(1000) {
		t.Errorf("logged %v, want one warning of the change from 10000 to 1000", logs.All())
	}
}
