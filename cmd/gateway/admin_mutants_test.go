package main

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The tests here each catch a mutant of the operator's subcommands that a mutation review of
// cmd/gateway found surviving; each names its mutant.

// TestPruneRefusesACutoffEqualToTallyTTL: a run settled exactly tally_ttl ago may still have
// its tally in Redis, which the same X-Run-Id sent again would count as the new run's. Mutant:
// `age <= holds.tally_ttl` -> `<`.
func TestPruneRefusesACutoffEqualToTallyTTL(t *testing.T) {
	count := useTestDatabase(t)
	aliceWithANamedRunSettledDaysAgo(t, 9)
	cfg := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(cfg, []byte("holds:\n  tally_ttl: 192h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pruneCmd(testCtx(t), []string{"-config", cfg, "-days", "8"}); !errors.Is(err, holds.ErrBadFilter) {
		t.Errorf("prune -days 8 with tally_ttl 8 days: %v, want holds.ErrBadFilter", err)
	}
	if n := count("SELECT COUNT(*) FROM run_holds"); n != 1 {
		t.Errorf("%d runs after a prune at tally_ttl, want the 1 kept", n)
	}
}

// TestGrantRetriedWithAnotherReasonCreditsOnce: the idempotency key alone names a grant; the
// reason is a note, so a retried script that words it differently gets the original grant
// and credits nothing more. Mutant: the key sent to the store made of -key and -reason.
func TestGrantRetriedWithAnotherReasonCreditsOnce(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	grant := func(reason string) map[string]any {
		t.Helper()
		raw, err := stdout(t, func() error {
			return grantCmd(ctx, []string{"-user", "alice", "-amount", "5", "-key", "pay-1", "-reason", reason})
		})
		if err != nil {
			t.Fatalf("grant -reason %q: %v", reason, err)
		}
		var g map[string]any
		if err := json.Unmarshal(raw, &g); err != nil {
			t.Fatalf("grant printed %q: %v", raw, err)
		}
		return g
	}
	first, again := grant("top-up"), grant("top-up, retried")
	if again["replayed"] != true || first["id"] != again["id"] {
		t.Errorf("the same -key with another -reason: %v then %v; want the original grant replayed", first, again)
	}
	if n := count("SELECT COUNT(*) FROM grants"); n != 1 {
		t.Errorf("%d grants written for one -key, want 1", n)
	}
	if n := count("SELECT COUNT(*) FROM users WHERE name = 'alice' AND prepaid_micro = 5000"); n != 1 {
		t.Errorf("alice's prepaid credits are not the one grant's 5 credits")
	}
}

// TestAuditFailsOnASingleMismatch: one mismatch is enough for a non-zero exit, which is what a
// cron job alerts on. Mutant: `len(bad) > 0` -> `> 1`.
func TestAuditFailsOnASingleMismatch(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := stdout(t, func() error { return auditCmd(ctx, nil) }); err != nil {
		t.Fatalf("audit of balanced books: %v", err)
	}
	db := openTestDatabase(t)
	if _, err := db.ExecContext(ctx,
		`INSERT INTO usage_days (user_id, day, used_micro, run_count) SELECT id, '2026-11-30', 40, 1 FROM users`); err != nil {
		t.Fatal(err)
	}
	out, err := stdout(t, func() error { return auditCmd(ctx, nil) })
	if err == nil || !strings.Contains(err.Error(), "1 mismatches") {
		t.Fatalf("audit with one day ledger of no settled charge: %v (printed %q); want it to fail on the one mismatch", err, out)
	}
}

// TestUserSetRefusesOverridesOutOfRange: `user set` takes -max-in-flight 1-10000,
// -discount-bp 0-10000 and a non-negative -allowance; the store writes what it is given, so
// the command is the bound. Mutants: intIn(1, …) -> intIn(0, …) for -max-in-flight; the
// allowance's `m >= 0` dropped.
func TestUserSetRefusesOverridesOutOfRange(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-max-in-flight", "0"}, {"-max-in-flight", "10001"},
		{"-discount-bp", "-1"}, {"-discount-bp", "10001"},
		{"-allowance", "-1"},
	} {
		if _, err := stdout(t, func() error { return userSet(ctx, append([]string{"-name", "alice"}, args...)) }); err == nil {
			t.Errorf("user set %v accepted", args)
		}
	}
	if n := count("SELECT COUNT(*) FROM users WHERE allowance_micro IS NOT NULL OR max_in_flight IS NOT NULL OR discount_bp IS NOT NULL"); n != 0 {
		t.Errorf("%d users with overrides written by refused user sets", n)
	}
	for _, args := range [][]string{{"-max-in-flight", "1"}, {"-discount-bp", "10000"}, {"-allowance", "0"}} {
		if _, err := stdout(t, func() error { return userSet(ctx, append([]string{"-name", "alice"}, args...)) }); err != nil {
			t.Errorf("user set %v: %v, want it accepted", args, err)
		}
	}
}

// TestReportCoversItsWholeRange: `report -from D1 -to D2` covers every day from D1 to D2, both
// included. The tests read one day only (-from and -to both today), so their order was
// unchecked. Mutants: -from read from -to's value; from and to swapped on the way to the store.
func TestReportCoversItsWholeRange(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	for _, day := range []string{"2026-11-01", "2026-11-03"} {
		for _, q := range []string{
			`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, charged_micro, allowance_part_micro, cost_micro, model, expires_at, settled_at)
			 SELECT CONCAT('r_', ?), id, 'settled', 100, 100, 40, 40, 40, 'm', CONCAT(?, ' 12:00:00'), CONCAT(?, ' 12:00:00') FROM users`,
			`INSERT INTO usage_days (user_id, day, used_micro, run_count) SELECT id, ?, 40, 1 FROM users`,
		} {
			args := []any{day, day, day}
			if strings.HasPrefix(strings.TrimSpace(q), "INSERT INTO usage_days") {
				args = args[:1]
			}
			if _, err := db.ExecContext(ctx, q, args...); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		from, to string
		rows     int
	}{{"2026-11-01", "2026-11-03", 2}, {"2026-11-02", "2026-11-03", 1}, {"2026-11-01", "2026-11-02", 1}} {
		raw, err := stdout(t, func() error { return reportCmd(ctx, []string{"-from", tc.from, "-to", tc.to, "-format", "json"}) })
		var rep struct {
			Data []map[string]any `json:"data"`
		}
		if err != nil || json.Unmarshal(raw, &rep) != nil || len(rep.Data) != tc.rows {
			t.Errorf("report -from %s -to %s: %s, %v; want %d rows", tc.from, tc.to, raw, err, tc.rows)
		}
	}
	testenv.CheckLedger(t, db)
}

// TestReportRefusesAnUnknownFormat: `report -format xml` is a typo or a format the gateway
// does not write; answered with CSV, a script that asked for one thing parsed another.
// Mutant: the -format check removed (anything but json printed CSV).
func TestReportRefusesAnUnknownFormat(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	for _, format := range []string{"xml", "JSON", ""} {
		raw, err := stdout(t, func() error { return reportCmd(ctx, []string{"-format", format}) })
		if err == nil || !strings.Contains(err.Error(), "want csv or json") {
			t.Errorf("report -format %q: %v, want the refusal naming csv and json", format, err)
		}
		if len(raw) != 0 {
			t.Errorf("report -format %q printed %q, want nothing", format, raw)
		}
	}
}
