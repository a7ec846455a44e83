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

// The tests here each catch mutants a mutation review of the operator's subcommands found
// surviving; each names them.

// TestLimitFlagEdges: -limit is 1 to admin.MaxListLimit, both ends included. Mutants:
// `limit < 1` -> `< 0`, `limit > Max` -> `>= Max`.
func TestLimitFlagEdges(t *testing.T) {
	for limit, ok := range map[int]bool{0: false, 1: true, 1000: true, 1001: false} {
		if err := limitFlag(limit); (err == nil) != ok {
			t.Errorf("limitFlag(%d) = %v, want ok %v", limit, err, ok)
		}
	}
}

// TestKeyRevokeDisableAndGrantCommands: `key revoke` takes either -key or -user with -prefix,
// never -key beside -prefix (which key did the operator mean?), and revokes nothing when
// refused; `user disable` refuses the user's keys and `user enable` restores them; a grant run
// again prints the original grant as replayed; `balance` shows the user's own prepaid credits.
// Mutants: the -prefix == "" condition of the -key form dropped; disable and enable swapped;
// the replayed flag inverted; balance read for another user id.
func TestKeyRevokeDisableAndGrantCommands(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	for _, name := range []string{"alice", "bob"} {
		if err := userCreate(ctx, []string{"-name", name}); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := stdout(t, func() error { return keyCreate(ctx, []string{"-user", "alice"}) })
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(string(raw))
	st := holds.NewStore(openTestDatabase(t), map[string]holds.Plan{"standard": {}}, "standard", nil)
	live := func() bool {
		_, err := st.UserByKey(ctx, key)
		return err == nil
	}
	if !live() {
		t.Fatalf("key %q from key create not accepted", key)
	}
	if err := keyRevoke(ctx, []string{"-key", key, "-prefix", holds.ShownPrefix(key)}); err == nil || !live() {
		t.Fatalf("key revoke -key with -prefix: %v, key live %v; want it refused and the key still live", err, live())
	}
	if _, err := stdout(t, func() error { return userDisable(ctx, []string{"-name", "alice"}) }); err != nil || live() {
		t.Fatalf("user disable: %v, key live %v; want it refused", err, live())
	}
	if _, err := stdout(t, func() error { return userEnable(ctx, []string{"-name", "alice"}) }); err != nil || !live() {
		t.Fatalf("user enable: %v, key live %v; want it accepted", err, live())
	}
	if _, err := stdout(t, func() error { return keyRevoke(ctx, []string{"-key", key}) }); err != nil || live() {
		t.Fatalf("key revoke -key: %v, key live %v; want it revoked", err, live())
	}

	grant := func() map[string]any {
		t.Helper()
		raw, err := stdout(t, func() error {
			return grantCmd(ctx, []string{"-user", "alice", "-amount", "5", "-key", "pay-" + t.Name()})
		})
		if err != nil {
			t.Fatal(err)
		}
		var g map[string]any
		if err := json.Unmarshal(raw, &g); err != nil {
			t.Fatalf("grant printed %q: %v", raw, err)
		}
		return g
	}
	if first, again := grant(), grant(); first["replayed"] != false || again["replayed"] != true || first["id"] != again["id"] {
		t.Fatalf("grant then the same -key again: %v, %v; want the original grant, replayed the second time", first, again)
	}
	raw, err = stdout(t, func() error { return balanceCmd(ctx, []string{"-user", "alice"}) })
	var b map[string]any
	if err != nil || json.Unmarshal(raw, &b) != nil || b["user"] != "alice" || b["prepaid"] != 5.0 {
		t.Fatalf("balance -user alice: %s, %v; want alice's 5 credits prepaid", raw, err)
	}
}

// TestRunsAndReportCommandsFilterByUser: -user keeps another user's runs out of `runs` and
// `report`. Mutants: f.UserID = d.ID and userID = d.ID dropped.
func TestRunsAndReportCommandsFilterByUser(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	for _, name := range []string{"alice", "bob"} {
		if err := userCreate(ctx, []string{"-name", name}); err != nil {
			t.Fatal(err)
		}
	}
	db := openTestDatabase(t)
	// One day for the rows and the report alike: the report's default day, read after a
	// midnight UTC the inserts fell before, would be the next one.
	var day string
	if err := db.GetContext(ctx, &day, "SELECT DATE_FORMAT(UTC_DATE(), '%Y-%m-%d')"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, charged_micro, allowance_part_micro, cost_micro, model, expires_at, settled_at)
		 SELECT CONCAT('r_', name), id, 'settled', 100, 100, 40, 40, 40, 'm', NOW(6), TIMESTAMP(?) + INTERVAL 12 HOUR FROM users`,
		`INSERT INTO usage_days (user_id, day, used_micro, run_count) SELECT id, ?, 40, 1 FROM users`,
	} {
		if _, err := db.ExecContext(ctx, q, day); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := stdout(t, func() error { return runsCmd(ctx, []string{"-user", "alice"}) })
	var runs struct {
		Data []map[string]any `json:"data"`
	}
	if err != nil || json.Unmarshal(raw, &runs) != nil || len(runs.Data) != 1 || runs.Data[0]["user"] != "alice" {
		t.Fatalf("runs -user alice: %s, %v; want alice's one run", raw, err)
	}
	raw, err = stdout(t, func() error {
		return reportCmd(ctx, []string{"-user", "alice", "-from", day, "-to", day, "-format", "json"})
	})
	var rep struct {
		Data []map[string]any `json:"data"`
	}
	if err != nil || json.Unmarshal(raw, &rep) != nil || len(rep.Data) != 1 || rep.Data[0]["user"] != "alice" {
		t.Fatalf("report -user alice: %s, %v; want alice's one row", raw, err)
	}
	testenv.CheckLedger(t, db)
}

// TestPruneRefusesACutoffEqualToReplayTTL: a run settled exactly replay_ttl ago may still be
// read by an Idempotency-Key replay. Mutant: `age <= replay_ttl` -> `<`.
func TestPruneRefusesACutoffEqualToReplayTTL(t *testing.T) {
	useTestDatabase(t)
	cfg := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(cfg, []byte("dedup:\n  replay_ttl: 192h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pruneCmd(testCtx(t), []string{"-config", cfg, "-days", "8"}); err == nil {
		t.Fatal("prune -days 8 with replay_ttl 8 days was accepted")
	}
}

// TestPruneRefusesABadBatchNamingTheFlag: `prune -days 7 -batch 10001` was refused with
// "prune: bad filter: batch of 10001, 1 to 10000 (0 runs pruned in 0 batches before it; run it
// again to go on)": it named no flag, and running it again, as it said, was refused again. A
// -batch out of range is refused as -days is, naming the flag and its range.
func TestPruneRefusesABadBatchNamingTheFlag(t *testing.T) {
	useTestDatabase(t)
	for _, batch := range []string{"0", "-5", "10001"} {
		err := pruneCmd(testCtx(t), []string{"-days", "7", "-batch", batch})
		if !errors.Is(err, holds.ErrBadFilter) || !strings.HasPrefix(err.Error(), "-batch "+batch+":") || strings.Contains(err.Error(), "run it again") {
			t.Errorf("prune -batch %s: %v, want it refused naming -batch and its range, not to run it again", batch, err)
		}
	}
}

// TestUserSetRefusesATooLargeAllowanceSayingSo: `user set -allowance 1000000000000` (a
// trillion credits, past what an amount may be) was refused with "want a non-negative number
// of credits in steps of 0.001", which it was: the operator was not told what was wrong. The
// refusal now says the amount is too large; the user is left as it was.
func TestUserSetRefusesATooLargeAllowanceSayingSo(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	err := userSet(ctx, []string{"-name", "alice", "-allowance", "1000000000000"})
	if err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("user set -allowance 1000000000000: %v; want it refused as too large", err)
	}
	if n := count("SELECT COUNT(*) FROM users WHERE allowance_micro IS NOT NULL"); n != 0 {
		t.Fatalf("%d allowance overrides written by a refused user set", n)
	}
}
