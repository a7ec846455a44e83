package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// The tests here each catch a mutant of serve's and the reconciler's wiring that a mutation
// review of cmd/gateway found surviving; each names its mutant.

// TestRedisLockReleaseLeavesAnotherHoldersLock: `reconcile -once` releases its lock at exit;
// if its pass outlasted the lock's TTL another process holds it by then, and the release must
// leave that one's lock alone. Mutant: the unlock script's ownership check dropped.
func TestRedisLockReleaseLeavesAnotherHoldersLock(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	key := runstate.Keys{Prefix: prefix}.ReconcileLock()
	a := redisLock{rdb: rdb, key: key, instance: "a", ttl: time.Minute}
	b := redisLock{rdb: rdb, key: key, instance: "b", ttl: time.Minute}
	if ok, err := b.TryLock(ctx); err != nil || !ok {
		t.Fatalf("b could not take a free lock: %v, %v", ok, err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v := rdb.Get(ctx, key).Val(); v != "b" {
		t.Fatalf("lock value %q after another instance's release, want b's lock kept", v)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("b's lock still there after b released it")
	}
}

// TestReconcilerExtendsALeasedHoldByHoldTTL: a leased call past its hold's expiry is extended
// by hold_ttl (a named run's by run_ttl), what admission would have given it. With the two
// equal by default the wiring was unchecked. Mutant: ExtendBy wired to run_ttl.
func TestReconcilerExtendsALeasedHoldByHoldTTL(t *testing.T) {
	count := useTestDatabase(t)
	useTestRedis(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	if _, err := db.ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at)
		 SELECT 'r_leased', id, 'running', 100, 100, 'm', NOW(6) - INTERVAL 1 SECOND FROM users`); err != nil {
		t.Fatal(err)
	}
	cfg := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(cfg, []byte("holds:\n  hold_ttl: 10m\n  run_ttl: 60m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := setup(ctx, "serve", []string{"-config", cfg}, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	gw, err := e.newGateway(e.store(), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw.leases.Acquire("r_leased")
	if _, err := gw.rec.RunForced(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(`SELECT COUNT(*) FROM run_holds WHERE run_id = 'r_leased' AND state = 'running'
		AND expires_at BETWEEN NOW(6) + INTERVAL 5 MINUTE AND NOW(6) + INTERVAL 15 MINUTE`); n != 1 {
		t.Errorf("the leased hold was not extended by hold_ttl (10 min)")
	}
}

// TestTallySourcePassesOnARedisFailure: asked whether a hold's admission was refused, or for
// its run's tally, while Redis fails, the reconciler must hear the failure and leave the hold
// for the next pass: read as "no mark" it charged a refused admission's whole hold. Mutant:
// Refused's error dropped.
func TestTallySourcePassesOnARedisFailure(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	opt := *rdb.Options()
	failing := redis.NewClient(&opt)
	failing.Close() // every command fails: redis: client is closed
	src := tallySource{runstate.NewTally(failing, runstate.Keys{Prefix: prefix}, time.Hour)}
	ctx := context.Background()
	if refused, err := src.Refused(ctx, "r_any", "tok"); err == nil {
		t.Errorf("refusal mark read on a failing Redis: %v, no error", refused)
	}
	if _, found, err := src.Tallied(ctx, "r_any"); err == nil {
		t.Errorf("tally read on a failing Redis: found %v, no error", found)
	}
}

// TestServeRecordsItsTTLs: `gateway serve` records its holds.tally_ttl and dedup.replay_ttl
// as the fleet's longest, which `gateway prune` must pass: unrecorded, a prune run with the
// default config cut runs whose tallies a gateway keeping them longer still had. Mutant: the
// call to recordTTLs dropped from serve.
func TestServeRecordsItsTTLs(t *testing.T) {
	useTestDatabase(t) // records the defaults, 48 h and 24 h
	useTestRedis(t)
	ctx := testCtx(t)
	cfg := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(cfg, []byte("holds:\n  tally_ttl: 240h\ndedup:\n  replay_ttl: 72h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LISTEN_ADDR", "127.0.0.1:0")
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := holds.NewStore(openTestDatabase(t), map[string]holds.Plan{"standard": {}}, "standard", nil)
	served := make(chan error, 1)
	go func() { served <- serve(sctx, func() {}, []string{"-config", cfg}) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		tally, replay, err := st.LongestTTLs(ctx)
		if err == nil && tally.TTL == 240*time.Hour && replay.TTL == 72*time.Hour {
			break
		}
		select {
		case err := <-served:
			t.Fatalf("serve returned %v before recording its TTLs", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve with tally_ttl 240h and replay_ttl 72h recorded %v, %v (%v); want them recorded", tally.TTL, replay.TTL, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel() // stopped wherever its start has got to
	if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("serve: %v", err)
	}
}

// TestReconcileOnceFailsWhenTheLockCannotBeAsked: a pass that could not ask for the lock (a
// Redis that refuses its script) scanned nothing, and `reconcile -once` said another process
// held the lock and exited 0, which a cron job reads as done. It fails. Mutant: the
// `err == nil` of "another process holds the lock" dropped.
func TestReconcileOnceFailsWhenTheLockCannotBeAsked(t *testing.T) {
	useTestDatabase(t)
	useTestRedis(t) // records the prefix the private Redis is then named under
	u := testenv.PrivateRedisURL(t, strings.Fields("--user default off --user gw on >gw-secret ~* &* +@all -@scripting")...)
	t.Setenv("REDIS_URL", strings.Replace(u, "redis://", "redis://gw:gw-secret@", 1))
	out, err := stdout(t, func() error { return reconcileOnce(testCtx(t), []string{"-once"}) })
	if err == nil || strings.Contains(string(out), "another process holds the lock") {
		t.Fatalf("reconcile -once on a Redis that refuses the lock's script: %q, %v; want it to fail", out, err)
	}
}

// TestDeadAfterFollowsFindDeadInstances: a serving process sweeps for dead instances at the
// configured bound when holds.find_dead_instances is on, and not at all when off. Mutant: the
// condition inverted.
func TestDeadAfterFollowsFindDeadInstances(t *testing.T) {
	h := config.Default().Holds
	h.FindDeadInstances = true
	if got, want := deadAfter(h), h.DeadInstanceBound(); got != want || got <= 0 {
		t.Errorf("deadAfter with find_dead_instances on: %v, want the bound %v", got, want)
	}
	h.FindDeadInstances = false
	if got := deadAfter(h); got != 0 {
		t.Errorf("deadAfter with find_dead_instances off: %v, want 0 (no sweep)", got)
	}
}

// TestPprofRefusesAnAddressNotLoopback: profiles show request data, so -pprof serves on a
// loopback address alone; a wildcard or any other interface's address is refused before
// anything listens. Mutant: the IsLoopback check dropped (only a host that is no IP refused).
func TestPprofRefusesAnAddressNotLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", "192.0.2.1:0", ":0"} {
		if err := servePprof(addr, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("-pprof %s: %v, want it refused as not loopback", addr, err)
		}
	}
}
