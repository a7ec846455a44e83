package holds_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// Test plan terms, in micro-USD (credit_micro 1000): the DESIGN defaults.
const (
	testAllowance  = 2_000_000
	testHoldNormal = 20_000
	testHoldHeavy  = 60_000
	testMaxRunCost = 500_000
)

func testPlans() map[string]holds.Plan {
	p := holds.Plan{AllowanceMicro: testAllowance, HoldNormalMicro: testHoldNormal, HoldHeavyMicro: testHoldHeavy,
		HeavyAfterTurns: 4, MaxInFlight: 3, MaxRunCostMicro: testMaxRunCost}
	return map[string]holds.Plan{"standard": p}
}

// storeEnv is a store on a fresh database, and the Redis side of the reconciler under a
// per-test key prefix. Every test that uses it ends with the ledger check.
type storeEnv struct {
	t     *testing.T
	db    *sqlx.DB
	store *holds.Store
	rdb   *redis.Client
	keys  runstate.Keys
	tally *runstate.Tally
	log   *zap.Logger
}

func newStoreEnv(t *testing.T) *storeEnv {
	t.Helper()
	return newStoreEnvOn(t, testenv.MySQL(t))
}

// newStoreEnvMidday is newStoreEnv with the database clock standing still at noon UTC
// (testenv.MySQLMidday), for a test whose charges must all land on one day's allowance.
func newStoreEnvMidday(t *testing.T) *storeEnv {
	t.Helper()
	return newStoreEnvOn(t, testenv.MySQLMidday(t))
}

func newStoreEnvOn(t *testing.T, db *sqlx.DB) *storeEnv {
	t.Helper()
	e := &storeEnv{t: t, db: db}
	var prefix string
	e.rdb, prefix = testenv.Redis(t)
	e.keys = runstate.Keys{Prefix: prefix}
	e.log = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	e.store = holds.NewStore(e.db, testPlans(), "standard", e.log)
	e.tally = runstate.NewTally(e.rdb, e.keys, time.Hour)
	t.Cleanup(func() { testenv.CheckLedger(t, e.db) })
	return e
}

func (e *storeEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

// user creates an account; maxInFlight lifts the plan's limit for tests that need many holds.
func (e *storeEnv) user(name string, maxInFlight int, discountBP *int) holds.User {
	e.t.Helper()
	u, err := e.store.CreateUser(e.ctx(), name, "standard")
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.store.SetUserLimits(e.ctx(), u.ID, nil, &maxInFlight, discountBP); err != nil {
		e.t.Fatal(err)
	}
	return u
}

func (e *storeEnv) admit(u holds.User, runID string, state holds.State) holds.Hold {
	e.t.Helper()
	h, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt",
		State: state, TTL: time.Hour})
	if err != nil {
		e.t.Fatalf("admit %s: %v", runID, err)
	}
	return h
}

// expire moves a hold's expiry into the past, as if its TTL had run out.
func (e *storeEnv) expire(runID string) {
	e.t.Helper()
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = ?", runID); err != nil {
		e.t.Fatal(err)
	}
}

func (e *storeEnv) run(u holds.User, runID string) holds.Run {
	e.t.Helper()
	r, err := e.store.Run(e.ctx(), u.ID, runID)
	if err != nil {
		e.t.Fatalf("run %s: %v", runID, err)
	}
	return r
}

func (e *storeEnv) addTally(runID string, u pricing.Usage, cost int64) {
	e.t.Helper()
	if err := e.tally.Add(e.ctx(), runID, u, cost, false); err != nil {
		e.t.Fatal(err)
	}
}

// ageTally sets runID's one-call tally's write time (runstate's write_ms, Redis's clock) back
// by d: a tally that has stood still for d, as GetAged reads it.
func (e *storeEnv) ageTally(runID string, d time.Duration) {
	e.t.Helper()
	now, err := e.rdb.Time(e.ctx()).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.rdb.HSet(e.ctx(), e.keys.Usage(runID), "write_ms", now.Add(-d).UnixMilli()).Err(); err != nil {
		e.t.Fatal(err)
	}
}

// ledgerUsed is the user's day ledger over all its days (testenv.LedgerUsed): what its
// settlements charged it, whether or not the test straddled midnight UTC.
func (e *storeEnv) ledgerUsed(u holds.User) int64 {
	e.t.Helper()
	used, err := testenv.LedgerUsed(e.ctx(), e.db, u.ID)
	if err != nil {
		e.t.Fatal(err)
	}
	return used
}

// The Redis side of the reconciler, as cmd/gateway wires it, over the test's key prefix.

type tallyUsage struct{ t *runstate.Tally }

func (s tallyUsage) Tallied(ctx context.Context, runID string) (holds.RunTally, bool, error) {
	t, age, found, err := s.t.GetAged(ctx, runID)
	if errors.Is(err, runstate.ErrTallyCorrupt) {
		err = fmt.Errorf("%w: %w", holds.ErrTallyCorrupt, err)
	}
	return holds.RunTally{Usage: t.Usage, CostMicro: t.CostMicro, Calls: t.Calls, Estimated: t.EstimatedCalls > 0,
		PriceSnapshot: []byte(t.PriceSnapshot), Age: age, Source: t.Source}, found, err
}

type leaseKeys struct {
	rdb  *redis.Client
	keys runstate.Keys
}

func (l leaseKeys) Exists(ctx context.Context, runID string) (bool, error) {
	n, err := l.rdb.Exists(ctx, l.keys.Lease(runID)).Result()
	return n == 1, err
}

// nxLock is the plain SET NX lock of DESIGN §5.
type nxLock struct {
	rdb      *redis.Client
	key      string
	instance string
	ttl      time.Duration
}

func (l nxLock) TryLock(ctx context.Context) (bool, error) {
	return l.rdb.SetNX(ctx, l.key, l.instance, l.ttl).Result()
}

// failingUsage is a tally that cannot be read (Redis down for the reconciler).
type failingUsage struct{}

func (failingUsage) Tallied(context.Context, string) (holds.RunTally, bool, error) {
	return holds.RunTally{}, false, fmt.Errorf("redis: connection refused")
}

// reconciler wires a reconciler over this env; mutate adjusts the config.
func (e *storeEnv) reconciler(instance string, mutate func(*holds.ReconcilerConfig)) *holds.Reconciler {
	cfg := holds.ReconcilerConfig{
		Store: e.store, Usage: tallyUsage{e.tally}, Leases: leaseKeys{e.rdb, e.keys},
		Lock: nxLock{rdb: e.rdb, key: e.keys.ReconcileLock(), instance: instance, ttl: time.Minute},
		Log:  e.log, ExtendBy: time.Minute, Interval: time.Second,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	return holds.NewReconciler(cfg)
}

// pass is one periodic pass: by the next tick the previous pass's lock has lapsed (lock TTL
// below the interval), which the test stands in for by deleting it.
func (e *storeEnv) pass(rec *holds.Reconciler) (holds.Stats, error) {
	e.t.Helper()
	if err := e.rdb.Del(e.ctx(), e.keys.ReconcileLock()).Err(); err != nil {
		e.t.Fatal(err)
	}
	return rec.RunOnce(e.ctx())
}
