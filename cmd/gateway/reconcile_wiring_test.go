package main

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestRedisLock: one holder at a time; the holder keeps (and refreshes) its lock when it asks
// again; the lock lapses on its own when its holder stops asking (a killed process).
func TestRedisLock(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	key := runstate.Keys{Prefix: prefix}.ReconcileLock()
	// Long enough that no pause of a busy machine lets a's lock lapse between its steps.
	a := redisLock{rdb: rdb, key: key, instance: "a", ttl: 3 * time.Second}
	b := redisLock{rdb: rdb, key: key, instance: "b", ttl: 3 * time.Second}
	try := func(l redisLock) bool {
		t.Helper()
		ok, err := l.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !try(a) {
		t.Fatal("a could not take a free lock")
	}
	if try(b) {
		t.Fatal("b took a's lock")
	}
	// Asking again refreshes the lock: its time to live is back near the full TTL.
	if err := rdb.PExpire(ctx, key, time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if !try(a) {
		t.Fatal("a lost its own lock on asking again")
	}
	if left := rdb.PTTL(ctx, key).Val(); left <= time.Second {
		t.Fatalf("lock has %v left after its holder asked again, want it refreshed to about 3 s", left)
	}
	if v := rdb.Get(ctx, key).Val(); v != "a" {
		t.Fatalf("lock value %q, want the holder's instance", v)
	}
	// a stops asking: its lock lapses and b gets it. Poll with a deadline, no fixed sleep.
	deadline := time.Now().Add(10 * time.Second)
	for !try(b) {
		if time.Now().After(deadline) {
			t.Fatal("a's lock never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if try(a) {
		t.Fatal("a took b's lock")
	}
}

// TestReconcilerSparesACallItsOwnProcessServes: the serving process's reconciler asked Redis
// alone whether a run was leased. A call whose lease key was missing while it ran (the
// heartbeat starved past lease_ttl on an overloaded host — once seen in the chaos suite — or
// Redis restarted empty since the last beat) was charged its whole hold by the very process
// serving it, and its real usage then found the hold settled. The process's own leases
// count: the hold is extended, not charged; a run no process serves is still charged.
func TestReconcilerSparesACallItsOwnProcessServes(t *testing.T) {
	count := useTestDatabase(t)
	useTestRedis(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	for _, run := range []string{"r_served_here", "r_orphan"} {
		if _, err := db.ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at)
			 SELECT ?, id, 'running', 100, 100, 'm', NOW(6) - INTERVAL 1 SECOND FROM users`, run); err != nil {
			t.Fatal(err)
		}
	}
	_, gw := servedGateway(t, ctx)
	gw.leases.Acquire("r_served_here") // in flight here; no heartbeat has written its key
	if _, err := gw.rec.RunForced(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count("SELECT COUNT(*) FROM run_holds WHERE run_id = 'r_served_here' AND state = 'running' AND expires_at > NOW(6)"); n != 1 {
		t.Errorf("the hold of a call this process serves was not extended (charged its hold while running?)")
	}
	if n := count("SELECT COUNT(*) FROM run_holds WHERE run_id = 'r_orphan' AND state = 'settled' AND charged_micro = 100"); n != 1 {
		t.Errorf("the hold no process serves was not charged its hold")
	}
}

// TestRedisLockThatWouldNeverLapse: the lock is only ever written with a TTL, so a killed
// holder blocks the others for one TTL at most. A lock key without one (set by hand, or
// PERSISTed) blocked every process's reconciler for good, silently: each ask found it held by
// someone else. A key of another type failed every ask, on every process, for good. The ask
// now gives a lock without a TTL one, so it lapses as a killed holder's does, and takes over a
// key that is no lock at all.
func TestRedisLockThatWouldNeverLapse(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	key := runstate.Keys{Prefix: prefix}.ReconcileLock()
	a := redisLock{rdb: rdb, key: key, instance: "a", ttl: 3 * time.Second}

	if err := rdb.Set(ctx, key, "not-an-instance", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.TryLock(ctx); err != nil || ok {
		t.Fatalf("ask of a lock held without a TTL: %v, %v; want refused, the holder unknown", ok, err)
	}
	if left := rdb.PTTL(ctx, key).Val(); left <= 0 || left > 3*time.Second {
		t.Fatalf("lock without a TTL left with %v to live after an ask; want it to lapse within the lock's TTL", left)
	}

	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, key, "holder", "a").Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.TryLock(ctx); err != nil || !ok {
		t.Fatalf("ask over a lock key that is no string: %v, %v; want the lock taken", ok, err)
	}
	if v := rdb.Get(ctx, key).Val(); v != "a" {
		t.Fatalf("lock value %q, want the holder's instance", v)
	}
}

// TestReconcilerLeaseThatWouldNeverLapse: a lease is only ever written with a TTL (lease_ttl,
// refreshed by its process's heartbeat), and its lapse is how the reconciler knows the process
// is gone. A lease key without one — written by hand, its value no instance at all, or
// PERSISTed — kept its hold extended at every pass, for good: never settled, counted in its
// user's calls in flight and held credits. The reconciler still counts it a lease this once,
// and gives it lease_ttl, so it lapses as a killed process's lease does and the hold settles.
func TestReconcilerLeaseThatWouldNeverLapse(t *testing.T) {
	count := useTestDatabase(t)
	rdb, prefix := useTestRedis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	if _, err := db.ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at)
		 SELECT 'r_forever', id, 'running', 100, 100, 'm', NOW(6) - INTERVAL 1 SECOND FROM users`); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, keys.Lease("r_forever"), "not-an-instance", 0).Err(); err != nil {
		t.Fatal(err)
	}
	e, gw := servedGateway(t, ctx)
	st, err := gw.rec.RunForced(ctx)
	if err != nil || st.Extended != 1 {
		t.Fatalf("pass: %+v, %v; want the leased hold extended", st, err)
	}
	ttl := e.cfg.Holds.LeaseTTL
	if left := rdb.PTTL(ctx, keys.Lease("r_forever")).Val(); left <= 0 || left > ttl {
		t.Fatalf("lease without a TTL left with %v to live after a pass; want it to lapse within lease_ttl %v", left, ttl)
	}
	// Once it has lapsed, the hold is settled as any other left behind.
	if err := rdb.Del(ctx, keys.Lease("r_forever")).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = 'r_forever'"); err != nil {
		t.Fatal(err)
	}
	if st, err := gw.rec.RunForced(ctx); err != nil || st.ChargedHeld != 1 {
		t.Fatalf("pass after the lease lapsed: %+v, %v; want the hold charged", st, err)
	}
	if n := count("SELECT COUNT(*) FROM run_holds WHERE run_id = 'r_forever' AND state = 'settled'"); n != 1 {
		t.Fatal("hold not settled once its lease lapsed")
	}
}

// servedGateway is the gateway `serve` would run on the test database and Redis (its
// reconciler, leases and proxy), not listening: its reconciler's passes are the test's to run.
func servedGateway(t *testing.T, ctx context.Context) (*env, gateway) {
	t.Helper()
	e, err := setup(ctx, "serve", nil, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	gw, err := e.newGateway(e.store(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return e, gw
}
