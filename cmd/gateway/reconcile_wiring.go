package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// reconcilerDeps are the collaborators newReconciler needs.
type reconcilerDeps struct {
	cfg       *config.Config
	store     *holds.Store
	rdb       redis.UniversalClient
	keys      runstate.Keys
	onOutcome func(string)
	// self is the serving process's instance; nil for an operator's one-off pass, which then
	// declares no instance dead (holds.ReconcilerConfig.Self).
	self *holds.Instance
	// leases are the serving process's own (nil for a one-off pass): a run they hold is
	// served here whatever Redis says (leaseChecker).
	leases          *runstate.Leases
	onDeadInstances func(int)
	onPass          func(failed bool)
}

// newReconciler wires the reconciler of DESIGN §5 from config.
func (e *env) newReconciler(d reconcilerDeps) (*holds.Reconciler, error) {
	prices, err := d.cfg.PriceTable()
	if err != nil {
		return nil, fmt.Errorf("reconciler: %w", err)
	}
	tally := tallySource{runstate.NewTally(d.rdb, d.keys, d.cfg.Holds.TallyTTL)}
	return holds.NewReconciler(holds.ReconcilerConfig{
		Store:    d.store,
		Usage:    tally,
		Leases:   leaseChecker{rdb: d.rdb, keys: d.keys, local: d.leases, ttl: d.cfg.Holds.LeaseTTL, log: e.log.Named("reconcile")},
		Refusals: tally,
		Lock:     redisLock{rdb: d.rdb, key: d.keys.ReconcileLock(), instance: d.cfg.Instance, ttl: d.cfg.Holds.ReconcileLockTTL},
		Log:      e.log.Named("reconcile"),
		// A leased run past its expiry is a call longer than its TTL; one more hold TTL (run
		// TTL for a named run) is what admission would have given it.
		ExtendBy:        d.cfg.Holds.HoldTTL,
		ExtendRunBy:     d.cfg.Holds.RunTTL,
		Interval:        d.cfg.Holds.ReconcileInterval,
		Batch:           d.cfg.Holds.ReconcileBatch,
		PriceSnapshot:   snapshotFunc(prices),
		OnOutcome:       d.onOutcome,
		DeadAfter:       deadAfter(d.cfg.Holds),
		Self:            d.self,
		OnDeadInstances: d.onDeadInstances,
		OnPass:          d.onPass,
		// A one-call run charged its hold is revisited while its call's tally may yet say it
		// used less (written after the charge, living tally_ttl from then).
		RefundWindow: d.cfg.Holds.TallyTTL,
		// A tally younger than a lease TTL may be set right yet by a resumed process whose
		// lease is not back yet.
		RefundAfter: d.cfg.Holds.LeaseTTL,
	}), nil
}

// snapshotFunc records, with a settlement from the tally of a hold that recorded no prices at
// admission (one admitted by an older gateway), the prices of the run's model as the table has
// them now: the tally holds cost, not prices, and this is then the closest record of what the
// run was billed at. Same shape as the proxy's snapshot.
func snapshotFunc(prices *pricing.Table) func(string) []byte {
	return func(model string) []byte {
		if model == "" {
			return nil
		}
		p, key, err := prices.Lookup(model)
		if err != nil {
			return nil
		}
		return p.Snapshot(key)
	}
}

// deadAfter is the reconciler's dead-instance bound: 0, no sweep at all, when the process
// does not take part (holds.find_dead_instances off).
func deadAfter(h config.Holds) time.Duration {
	if !h.FindDeadInstances {
		return 0
	}
	return h.DeadInstanceBound()
}

// The adapters here give the reconciler (package holds, which must not import metering) the
// Redis facts it needs: a run's tally, whether a live process leases it, whether a hold's
// admission was refused (its request's mark), and the scan lock.

// tallySource reads runs' tallies for the reconciler.
type tallySource struct{ t *runstate.Tally }

func (s tallySource) Tallied(ctx context.Context, runID string) (holds.RunTally, bool, error) {
	t, age, found, err := s.t.GetAged(ctx, runID)
	if errors.Is(err, runstate.ErrTallyCorrupt) {
		return holds.RunTally{}, false, fmt.Errorf("%w: %w", holds.ErrTallyCorrupt, err)
	}
	if err != nil {
		return holds.RunTally{}, false, err
	}
	return holds.RunTally{Usage: t.Usage, CostMicro: t.CostMicro, Calls: t.Calls, Estimated: t.EstimatedCalls > 0,
		PriceSnapshot: []byte(t.PriceSnapshot), Age: age, Source: t.Source}, found, nil
}

// Refused reads a refused admission's mark (runstate.Tally.MarkRefused).
func (s tallySource) Refused(ctx context.Context, runID, token string) (bool, error) {
	refused, err := s.t.Refused(ctx, runID, token)
	if errors.Is(err, runstate.ErrTallyCorrupt) {
		return false, fmt.Errorf("%w: %w", holds.ErrTallyCorrupt, err)
	}
	return refused, err
}

// leaseChecker asks whether any process still serves a run: this process's own leases
// first, then the lease keys in Redis. A key alone misses a call this process serves whose
// heartbeat has not written it in time (starved on an overloaded host, or Redis restarted
// empty since the last beat), and the reconciler would charge a live call its hold; the
// process serving it knows without asking. Other processes' calls are known by key alone.
//
// A lease is only ever written with a TTL (lease_ttl), and its lapse is how a killed process
// is known. A key without one (written by hand, or PERSISTed) counts as a lease this once and
// is given ttl: left alone, it kept its hold extended at every pass, for good.
type leaseChecker struct {
	rdb   redis.UniversalClient
	keys  runstate.Keys
	local *runstate.Leases // nil: a one-off pass serves nothing
	ttl   time.Duration    // lease_ttl, given to a lease key without one; 0: none given
	log   *zap.Logger      // nil: the TTL given is not logged
}

// Redis's PTTL answers for a key that does not exist and for one without a TTL.
const (
	pttlNoKey = -2 * time.Nanosecond
	pttlNoTTL = -1 * time.Nanosecond
)

func (l leaseChecker) Exists(ctx context.Context, runID string) (bool, error) {
	if l.local != nil && l.local.Serving(runID) {
		return true, nil
	}
	key := l.keys.Lease(runID)
	left, err := l.rdb.PTTL(ctx, key).Result()
	if err != nil {
		return false, fmt.Errorf("lease %s: %w", runID, err)
	}
	if left == pttlNoKey {
		return false, nil
	}
	if left == pttlNoTTL && l.ttl > 0 {
		if err := l.rdb.PExpire(ctx, key, l.ttl).Err(); err != nil {
			return false, fmt.Errorf("lease %s without a TTL: %w", runID, err)
		}
		if l.log != nil {
			l.log.Error("reconcile: the run's lease had no TTL, which no process writes; given lease_ttl so that it lapses — someone should look",
				zap.String("run_id", runID), zap.String("key", key), zap.Duration("ttl", l.ttl))
		}
	}
	return true, nil
}

// redisLock is `SET billing:reconcile:lock <instance> NX PX ttl`. A holder that asks again
// while its lock lives keeps it (and refreshes it), so with a lock TTL at or above the
// interval the same process keeps scanning instead of the lock going to whoever ticks first.
// The lock is never released: it lapses after ttl, which bounds how long a killed holder
// blocks the others.
type redisLock struct {
	rdb      redis.UniversalClient
	key      string
	instance string
	ttl      time.Duration
}

// lockScript takes the lock if free or already ours, in one step so that no other process
// can take it between a check and a refresh. The lock is only ever written with a TTL; a key
// no process wrote (by hand, or PERSISTed) must not stop every reconciler for good: one of
// another type, which failed every ask, is taken over, and one held without a TTL is given
// one, so it lapses as a killed holder's lock does.
var lockScript = redis.NewScript(`
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'string' and t ~= 'none' then
  redis.call('DEL', KEYS[1])
end
local v = redis.call('GET', KEYS[1])
if v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

func (l redisLock) TryLock(ctx context.Context) (bool, error) {
	n, err := lockScript.Run(ctx, l.rdb, []string{l.key}, l.instance, l.ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("reconcile lock %s: %w", l.key, err)
	}
	return n == 1, nil
}

// unlockScript deletes the lock only if it is still ours: once it has lapsed another process
// may hold it.
var unlockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// Release gives the lock back, if it is still this instance's. Only the operator's one-off
// pass does: its process is gone a moment later, and its lock, left to lapse, stopped the
// next `reconcile -once` (another process's, by its instance) and every gateway for its TTL.
func (l redisLock) Release(ctx context.Context) error {
	if err := unlockScript.Run(ctx, l.rdb, []string{l.key}, l.instance).Err(); err != nil {
		return fmt.Errorf("release reconcile lock %s: %w", l.key, err)
	}
	return nil
}
