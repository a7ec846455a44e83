package metering

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/pricing"
)

// RunBudget shares a named run's cap between its calls (DESIGN §4). Calls of one run may run
// at once, on any process, and each is tallied only when it ends: checking "tallied cost +
// this call's worst case ≤ cap" against the tally alone would let k concurrent calls each
// spend the whole cap. So each call reserves its worst case before it is forwarded, against
// what the run has tallied plus what its calls in flight have reserved, and gives the
// reservation back in the same step that tallies its usage. The count of calls in flight is
// also what keeps a run from being settled under a running call (CloseRun).
//
// The reservation lives in its own hash next to the run's tally, in the same hash slot:
// reserved_micro, inflight and, once the run is being settled, closed. It expires run_ttl
// after the run's last call started or ended, like the run's hold; a process that dies mid-call
// leaves its reservation and in-flight count behind until then.
type RunBudget struct {
	rdb      redis.UniversalClient
	keys     Keys
	tallyTTL time.Duration
	ttl      time.Duration
}

// Errors of Reserve and CloseRun.
var (
	ErrRunBudget = errors.New("run budget exhausted")
	ErrRunClosed = errors.New("run is being settled")
	ErrRunBusy   = errors.New("calls of the run are in flight")
)

// NewRunBudget wires run budgets: tallyTTL is the tally's (see NewTally), ttl the run's
// (run_ttl).
func NewRunBudget(rdb redis.UniversalClient, keys Keys, tallyTTL, ttl time.Duration) *RunBudget {
	if tallyTTL <= 0 || ttl <= 0 {
		panic("metering: run budget without TTLs")
	}
	return &RunBudget{rdb: rdb, keys: keys, tallyTTL: tallyTTL, ttl: ttl}
}

// reserveScript: KEYS usage, budget hash; ARGV budget, want, least, ttl ms. Returns the grant,
// -1 when nothing or less than least is left, -2 when the run is closed.
var reserveScript = redis.NewScript(`
if redis.call('HGET', KEYS[2], 'closed') then return -2 end
local spent = tonumber(redis.call('HGET', KEYS[1], 'cost_micro') or '0')
local reserved = tonumber(redis.call('HGET', KEYS[2], 'reserved_micro') or '0')
local left = tonumber(ARGV[1]) - spent - reserved
if left <= 0 or left < tonumber(ARGV[3]) then return -1 end
local grant = math.min(tonumber(ARGV[2]), left)
redis.call('HINCRBY', KEYS[2], 'reserved_micro', grant)
redis.call('HINCRBY', KEYS[2], 'inflight', 1)
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return grant`)

// Reserve takes up to want micro-USD (list price) of the run's budget for one call: budget
// minus what the run has tallied minus what its calls in flight have reserved. It fails with
// ErrRunBudget when nothing, or less than least (the call's cost without any output), is left, and with
// ErrRunClosed once the run is being settled. Every successful Reserve must be followed by
// one Release.
func (b *RunBudget) Reserve(ctx context.Context, runID string, budget, want, least int64) (int64, error) {
	if want < least || least < 0 || budget > pricing.MaxCost || want > pricing.MaxCost {
		panic(fmt.Sprintf("metering: reserve want %d least %d budget %d", want, least, budget))
	}
	grant, err := reserveScript.Run(ctx, b.rdb, []string{b.keys.Usage(runID), b.keys.RunBudget(runID)},
		budget, want, least, b.ttl.Milliseconds()).Int64()
	switch {
	case err != nil:
		return 0, fmt.Errorf("reserve for run %s: %w", runID, err)
	case grant == -1:
		return 0, ErrRunBudget
	case grant == -2:
		return 0, ErrRunClosed
	}
	return grant, nil
}

// releaseScript: KEYS usage, budget hash; ARGV in, cache read, cache write, out, cost, calls,
// reserved, tally ttl ms, budget ttl ms. The budget hash is only decremented while it exists:
// one that expired under a call longer than run_ttl must not come back negative, which would
// give the run's next calls budget it does not have.
var releaseScript = redis.NewScript(`
redis.call('HINCRBY', KEYS[1], 'in_tok', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'cache_read_tok', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'cache_write_tok', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'out_tok', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'cost_micro', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'calls', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[8])
if redis.call('EXISTS', KEYS[2]) == 1 then
  if redis.call('HINCRBY', KEYS[2], 'reserved_micro', -tonumber(ARGV[7])) < 0 then
    redis.call('HSET', KEYS[2], 'reserved_micro', 0)
  end
  if redis.call('HINCRBY', KEYS[2], 'inflight', -1) < 0 then
    redis.call('HSET', KEYS[2], 'inflight', 0)
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[9])
end
return 1`)

// Release tallies one call of the run and gives back its reservation in one step, so the
// call's cost is never counted twice against the budget nor missing from it. A call that
// used nothing still leaves the tally, as evidence for the reconciler (see Tally.MarkUnused),
// but does not count as a call.
func (b *RunBudget) Release(ctx context.Context, runID string, u pricing.Usage, costMicro, reserved int64) error {
	calls := 1
	if costMicro == 0 && u == (pricing.Usage{}) {
		calls = 0
	}
	err := releaseScript.Run(ctx, b.rdb, []string{b.keys.Usage(runID), b.keys.RunBudget(runID)},
		u.Input, u.CacheRead, u.CacheWrite, u.Output, costMicro, calls, reserved,
		b.tallyTTL.Milliseconds(), b.ttl.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("tally and release for run %s: %w", runID, err)
	}
	return nil
}

// closeScript: KEYS budget hash; ARGV ttl ms. Returns 0 while calls are in flight.
var closeScript = redis.NewScript(`
if tonumber(redis.call('HGET', KEYS[1], 'inflight') or '0') > 0 then return 0 end
redis.call('HSET', KEYS[1], 'closed', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`)

// CloseRun marks the run as being settled, so that no call of it starts from now on and its
// tally is final. It fails with ErrRunBusy while calls of the run are in flight: settling
// then would leave their usage out of the charge.
func (b *RunBudget) CloseRun(ctx context.Context, runID string) error {
	ok, err := closeScript.Run(ctx, b.rdb, []string{b.keys.RunBudget(runID)}, b.ttl.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("close run %s: %w", runID, err)
	}
	if ok == 0 {
		return ErrRunBusy
	}
	return nil
}
