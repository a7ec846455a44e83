package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileOnceRefusesAnotherRedisPrefix: `reconcile -once` read tallies and leases under
// its own config's redis_key_prefix, and nothing checked it against the fleet's: run without
// the gateways' TOLLGATE_REDIS_PREFIX (or with another), it found neither the lease of a call
// still running nor the tally of one that used 30 000 of its 100 000 µUSD hold, and charged
// both their whole holds. It now refuses a prefix other than the one the fleet's gateways
// recorded, naming both and -config, before it settles anything; with the fleet's prefix the
// live call is extended and the tallied one charged what it used.
func TestReconcileOnceRefusesAnotherRedisPrefix(t *testing.T) {
	count := useTestDatabase(t)
	rdb, prefix := useTestRedis(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"r_live", "r_tallied"} {
		if _, err := openTestDatabase(t).ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at)
			SELECT ?, id, 'running', 100000, 100000, 'm', NOW(6) - INTERVAL 1 MINUTE FROM users`, run); err != nil {
			t.Fatal(err)
		}
	}
	keys := runstate.Keys{Prefix: prefix}
	if err := rdb.Set(ctx, keys.Lease("r_live"), "gw-1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := runstate.NewTally(rdb, keys, time.Hour).Add(ctx, "r_tallied", pricing.Usage{Input: 10}, 30_000, false); err != nil {
		t.Fatal(err)
	}

	for _, other := range []string{"", "other:"} {
		t.Setenv("TOLLGATE_REDIS_PREFIX", other)
		out, err := stdout(t, func() error { return reconcileOnce(ctx, []string{"-once"}) })
		var mismatch *holds.RedisPrefixMismatchError
		if !errors.As(err, &mismatch) || !strings.Contains(err.Error(), "-config") || !strings.Contains(err.Error(), "TOLLGATE_REDIS_PREFIX") ||
			!strings.Contains(err.Error(), `"`+prefix+`"`) {
			t.Errorf("reconcile -once under prefix %q beside a fleet under %q: %v; want it refused naming both, TOLLGATE_REDIS_PREFIX and -config",
				other, prefix, err)
		}
		if len(out) != 0 {
			t.Errorf("refused reconcile -once printed %s", out)
		}
		if n := count("SELECT COUNT(*) FROM run_holds WHERE state = 'settled'"); n != 0 {
			t.Fatalf("%d holds settled by reconcile -once under prefix %q, want none", n, other)
		}
	}

	t.Setenv("TOLLGATE_REDIS_PREFIX", prefix)
	if _, err := stdout(t, func() error { return reconcileOnce(ctx, []string{"-once"}) }); err != nil {
		t.Fatalf("reconcile -once under the fleet's prefix: %v", err)
	}
	if n := count("SELECT COUNT(*) FROM run_holds WHERE run_id = 'r_live' AND state = 'running' AND expires_at > NOW(6)"); n != 1 {
		t.Errorf("the leased call was not extended")
	}
	if n := count("SELECT charged_micro FROM run_holds WHERE run_id = 'r_tallied' AND state = 'settled'"); n != 30_000 {
		t.Errorf("the tallied call charged %d, want its tally's 30000", n)
	}
}

// TestReconcileOnceRefusesWhileNoRedisPrefixIsRecorded: on a database no gateway of this version
// has served (one just migrated while the old gateways serve on), under which prefix their
// leases and tallies are is unknown: `reconcile -once` is refused, saying to start the gateway,
// and settles nothing.
func TestReconcileOnceRefusesWhileNoRedisPrefixIsRecorded(t *testing.T) {
	count := useTestDatabase(t)
	useTestRedis(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	for _, q := range []string{"DELETE FROM redis_prefix",
		`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at)
		 SELECT 'r_1', id, 'running', 100000, 100000, 'm', NOW(6) - INTERVAL 1 MINUTE FROM users`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	_, err := stdout(t, func() error { return reconcileOnce(ctx, []string{"-once"}) })
	if !errors.Is(err, holds.ErrNoRedisPrefix) || !strings.Contains(err.Error(), "gateway serve") {
		t.Errorf("reconcile -once with no prefix recorded: %v, want holds.ErrNoRedisPrefix saying to start `gateway serve`", err)
	}
	if n := count("SELECT COUNT(*) FROM run_holds WHERE state = 'settled'"); n != 0 {
		t.Errorf("%d holds settled with no prefix recorded, want none", n)
	}
}

// TestServeRecordsItsRedisPrefixAndRefusesAnother: the first gateway records the prefix its
// Redis keys are under; one started under another is refused, naming both and
// -change-redis-prefix, and leaves the record alone (beside the fleet, its reconciler would
// see none of the others' leases and tallies and charge their calls whole holds); with
// -change-redis-prefix its prefix is recorded, and the change logged.
func TestServeRecordsItsRedisPrefixAndRefusesAnother(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	db := openTestDatabase(t)
	if _, err := db.ExecContext(ctx, "DELETE FROM redis_prefix"); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.RedisKeyPrefix = "fleet:"
	st := holds.NewStore(db, map[string]holds.Plan{"standard": {}}, "standard", zap.NewNop())
	core, logs := observer.New(zapcore.InfoLevel)
	for range 2 {
		if err := recordRedisPrefix(ctx, st, cfg, false, zap.New(core)); err != nil {
			t.Fatalf("gateway under the fleet's prefix: %v", err)
		}
	}
	if err := st.CheckRedisPrefix(ctx, "fleet:"); err != nil {
		t.Fatalf("check of the recorded prefix: %v", err)
	}

	// `gateway serve` under another prefix beside it. Were it not refused, it would serve
	// until sctx ends.
	t.Setenv("LISTEN_ADDR", "127.0.0.1:0")
	t.Setenv("TOLLGATE_REDIS_PREFIX", "other:")
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := serve(sctx, func() {}, nil)
	var mismatch *holds.RedisPrefixMismatchError
	if !errors.As(err, &mismatch) || !strings.Contains(err.Error(), "-change-redis-prefix") ||
		!strings.Contains(err.Error(), `"other:"`) || !strings.Contains(err.Error(), `"fleet:"`) {
		t.Fatalf("serve under other: beside a fleet under fleet:: %v, want it refused naming both and -change-redis-prefix", err)
	}
	if err := st.CheckRedisPrefix(ctx, "fleet:"); err != nil {
		t.Fatalf("record after a refused serve: %v, want fleet: still", err)
	}

	cfg.RedisKeyPrefix = "other:"
	if err := recordRedisPrefix(ctx, st, cfg, true, zap.New(core)); err != nil {
		t.Fatalf("deliberate change: %v", err)
	}
	if err := st.CheckRedisPrefix(ctx, "other:"); err != nil {
		t.Fatalf("record after -change-redis-prefix: %v, want other:", err)
	}
	changed := logs.FilterMessageSnippet("redis_key_prefix changed").All()
	if len(changed) != 1 || changed[0].ContextMap()["previous_redis_key_prefix"] != "fleet:" || changed[0].ContextMap()["redis_key_prefix"] != "other:" {
		t.Errorf("logged %v, want one warning of the change from fleet: to other:", logs.All())
	}
}

// TestPruneIsBoundByTheFleetsLongestTTLs: `gateway prune` checked -days against its own
// config's holds.tally_ttl and dedup.replay_ttl, while the fleet's gateways may serve with
// longer ones: run with the default config (tally_ttl 48 h) beside a gateway keeping tallies
// 10 days, `prune -days 8` deleted a named run settled 9 days ago whose tally was still in
// Redis, so its X-Run-Id sent again opened a new run that counted the pruned one's calls. Each
// serve records its TTLs, the longest kept (a later serve with shorter ones does not lower
// them: the longer keys are still there), and prune refuses a cutoff within them, naming the
// setting, its value and the gateway; past them it prunes. Nothing recorded is refused.
func TestPruneIsBoundByTheFleetsLongestTTLs(t *testing.T) {
	count := useTestDatabase(t) // the fleet's gateways recorded the default TTLs: 48 h, 24 h
	ctx := testCtx(t)
	db := aliceWithANamedRunSettledDaysAgo(t, 14)
	serveWith := func(instance string, tallyTTL, replayTTL time.Duration) {
		t.Helper()
		cfg := config.Default()
		cfg.Instance, cfg.Holds.TallyTTL, cfg.Dedup.ReplayTTL = instance, tallyTTL, replayTTL
		if err := recordTTLs(ctx, holds.NewStore(db, map[string]holds.Plan{"standard": {}}, "standard", zap.NewNop()), cfg, zap.NewNop()); err != nil {
			t.Fatal(err)
		}
	}
	serveWith("gw-long-tally", 240*time.Hour, 24*time.Hour)
	serveWith("gw-long-replay", 48*time.Hour, 288*time.Hour)
	serveWith("gw-short", 48*time.Hour, 24*time.Hour) // lowers nothing
	for _, tc := range []struct{ days, want string }{
		{"8", "holds.tally_ttl 240h0m0s, recorded by gateway gw-long-tally"},
		{"12", "dedup.replay_ttl 288h0m0s, recorded by gateway gw-long-replay"},
	} {
		err := pruneCmd(ctx, []string{"-days", tc.days})
		if !errors.Is(err, holds.ErrBadFilter) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("prune -days %s with the default config beside the fleet's longer TTLs: %v; want holds.ErrBadFilter naming %q", tc.days, err, tc.want)
		}
	}
	if n := count("SELECT COUNT(*) FROM run_holds"); n != 1 {
		t.Fatalf("%d runs after prunes within the fleet's TTLs, want the 1 kept", n)
	}

	if _, err := db.ExecContext(ctx, "DELETE FROM longest_replay_ttl"); err != nil {
		t.Fatal(err)
	}
	if err := pruneCmd(ctx, []string{"-days", "13"}); !errors.Is(err, holds.ErrNoLongestTTLs) || !strings.Contains(err.Error(), "gateway serve") {
		t.Errorf("prune with no replay_ttl recorded: %v, want holds.ErrNoLongestTTLs saying to start `gateway serve`", err)
	}
	serveWith("gw-short", 48*time.Hour, 24*time.Hour)
	out, err := stdout(t, func() error { return pruneCmd(ctx, []string{"-days", "13"}) })
	if err != nil || !strings.Contains(string(out), "pruned 1 settled runs") {
		t.Fatalf("prune -days 13 past every recorded TTL: %q, %v", out, err)
	}
}
