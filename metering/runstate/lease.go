package runstate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Leases tells the reconciler which runs a live process still serves. One heartbeat per
// process refreshes every lease it holds in one pipeline; a killed process stops refreshing
// and its leases lapse after ttl, which is how the reconciler knows a run was orphaned.
type Leases struct {
	rdb      redis.UniversalClient
	keys     Keys
	instance string
	ttl      time.Duration
	interval time.Duration
	log      *zap.Logger

	mu   sync.Mutex
	runs map[string]*lease // run id -> its calls in flight on this process
	beat int64             // the last heartbeat's number (nextBeat)
}

// lease is this process's claim on one run.
type lease struct {
	calls int
	// written: a Refresh has taken the run since its first call here began, so its key may be
	// in Redis. A run never written has no key of this process's to delete: most calls end
	// well within a heartbeat, and their release then costs no round trip.
	written bool
	// beat is the number of the last Refresh that took the run, or found it held again after
	// taking an earlier claim on it (dropReleased): its release outdates that heartbeat's
	// write of the key, and every earlier one.
	beat int64
}

// NewLeases wires leases; interval must be well below ttl.
func NewLeases(rdb redis.UniversalClient, keys Keys, instance string, ttl, interval time.Duration, log *zap.Logger) *Leases {
	if interval <= 0 || interval >= ttl {
		panic(fmt.Sprintf("runstate: lease interval %v must be in (0, ttl %v)", interval, ttl))
	}
	return &Leases{rdb: rdb, keys: keys, instance: instance, ttl: ttl, interval: interval, log: log, runs: map[string]*lease{}}
}

// Acquire marks runID as served here. It writes nothing: the next heartbeat does, within one
// interval, and a lease only matters to the reconciler once a hold has outlived its TTL —
// minutes, against a heartbeat of seconds — so the call does not wait for Redis. Calls of
// one agent run may overlap, so leases count.
func (l *Leases) Acquire(runID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ls, ok := l.runs[runID]; ok {
		ls.calls++
		return
	}
	l.runs[runID] = &lease{calls: 1}
}

// Release drops this process's claim on runID; the key is deleted when the last call of the
// run on this process ends, if a heartbeat wrote it. An agent run between calls keeps no
// lease: its hold's run_ttl covers it.
func (l *Leases) Release(ctx context.Context, runID string) error {
	l.mu.Lock()
	ls, ok := l.runs[runID]
	if !ok {
		l.mu.Unlock()
		panic("runstate: lease released more often than acquired: " + runID)
	}
	ls.calls--
	last := ls.calls == 0
	if last {
		delete(l.runs, runID)
	}
	l.mu.Unlock()
	if !last || !ls.written {
		// A Refresh under way that took the run has marked it written first; one that starts
		// from now on does not see it.
		return nil
	}
	if err := leaseReleaseScript.Run(ctx, l.rdb, []string{l.keys.Lease(runID), l.keys.LeaseReleased(runID)},
		l.instance, ls.beat, l.ttl.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("release lease %s: %w", runID, err)
	}
	return nil
}

// Refresh writes every lease this process holds, in pipelines of refreshBatch sent together
// (inBatches). The heartbeat
// calls it; so may a caller that needs the keys written now.
func (l *Leases) Refresh(ctx context.Context) error {
	l.mu.Lock()
	beat := l.nextBeat()
	ids := make([]string, 0, len(l.runs))
	for id, ls := range l.runs {
		ls.written = true // before the SET is sent: a Release from now on deletes the key
		ls.beat = beat
		ids = append(ids, id)
	}
	l.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	if err := leaseBeatScript.Load(ctx, l.rdb).Err(); err != nil {
		return errors.Join(fmt.Errorf("refresh %d leases: %w", len(ids), err), l.dropReleasedAfter(ctx, ids, beat))
	}
	err := inBatches(len(ids), func(start, end int) error {
		batch := ids[start:end]
		_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range batch {
				leaseBeatScript.EvalSha(ctx, p, []string{l.keys.Lease(id), l.keys.LeaseReleased(id)}, l.instance,
					l.ttl.Milliseconds(), beat)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("refresh %d leases: %w", len(batch), err)
		}
		return nil
	})
	// Some SETs of a failed beat may have landed: a run released meanwhile must still lose its key.
	return errors.Join(err, l.dropReleasedAfter(ctx, ids, beat))
}

// Run refreshes leases until ctx ends.
func (l *Leases) Run(ctx context.Context) { heartbeat(ctx, l.interval, "lease", l.Refresh, l.log) }

// Held is the number of runs this process holds leases for: a call that ended without
// releasing its lease shows here (the proxy's tests look).
func (l *Leases) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.runs)
}

// Serving says whether a call of runID is in flight on this process. The serving process's
// reconciler asks it before Redis: a lease key can be missing while the call runs (the first
// heartbeat not yet sent, or one starved past lease_ttl on an overloaded host, or Redis
// restarted empty since), and the process that serves the call knows without asking.
func (l *Leases) Serving(runID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.runs[runID]
	return ok
}

// nextBeat numbers a heartbeat: the clock's milliseconds, past the last beat's. A process
// restarted under the same instance name numbers its beats past its old ones (a clock stepped
// back by more than lease_ttl aside), so its old releases do not outdate them. Called with mu
// held.
func (l *Leases) nextBeat() int64 {
	l.beat = max(time.Now().UnixMilli(), l.beat+1)
	return l.beat
}

// dropReleasedAfter is dropReleased on a deadline of its own: a beat whose SETs were
// answered after its deadline (a slow Redis) may have put back the key of a run released
// meanwhile, and on the beat's ended context the delete was never sent — the key stayed for
// the lease's TTL, the run looking served by a live process (its settle 409 run_busy, the
// reconciler extending it).
func (l *Leases) dropReleasedAfter(ctx context.Context, ids []string, beat int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropReleasedTimeout)
	defer cancel()
	return l.dropReleased(ctx, ids, beat)
}

// dropReleasedTimeout bounds dropReleasedAfter's deletes: one round trip, as a tally write.
const dropReleasedTimeout = 2 * time.Second

// dropReleased deletes the lease keys of the runs among ids no longer held here, and outdates
// the heartbeat beat's writes of them.
func (l *Leases) dropReleased(ctx context.Context, ids []string, beat int64) error {
	// A run released while Refresh's pipeline was on its way had its key deleted before a SET
	// put it back: it would then look served for a whole TTL (its run unsettleable, left
	// alone by the reconciler). Delete what is no longer held; a run acquired again meanwhile
	// is held and keeps its key, which its release must then delete: it is marked written, and
	// its release outdates this beat. The beat took the run's earlier claim, whose release may
	// have failed: without it the new claim's release outdated no beat, and this one's write,
	// delivered late, put the lease back for a whole TTL.
	var gone []string
	l.mu.Lock()
	for _, id := range ids {
		if ls, held := l.runs[id]; held {
			ls.written = true
			ls.beat = max(ls.beat, beat)
		} else {
			gone = append(gone, id)
		}
	}
	l.mu.Unlock()
	if len(gone) == 0 {
		return nil
	}
	// One script per key (the keys live in different Cluster slots), sent whole: EVALSHA in a
	// pipeline cannot fall back on a script cache miss.
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range gone {
			p.Eval(ctx, leaseReleaseLua, []string{l.keys.Lease(id), l.keys.LeaseReleased(id)}, l.instance, beat, l.ttl.Milliseconds())
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("drop %d leases released during the refresh: %w", len(gone), err)
	}
	return nil
}

// leaseReleaseLua deletes a lease only if this process wrote it last: calls of one named run may be
// served by two processes, and one's release must not drop the lease the other still needs.
// KEYS lease, released beats; ARGV instance, the last beat that took the run, lease ttl ms.
// First it records that beat as outdated for this process (for a lease TTL): a heartbeat's
// write that reaches Redis after the release (delayed on the network past the beat's deadline
// and the drop that follows it) finds it and writes nothing. Without it that write put the
// lease back for a whole TTL, the run looking served by a live process: its settle 409
// run_busy, the reconciler extending it.
const leaseReleaseLua = `
local g = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[2]) > g then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`

// leaseBeatScript writes a run's lease for this process: KEYS lease, released beats; ARGV
// instance, lease ttl ms, beat. Not when a release of the run here has outdated this beat
// (leaseReleaseLua): the write arrived after it.
var leaseBeatScript = redis.NewScript(`
local g = redis.call('HGET', KEYS[2], ARGV[1])
if g and tonumber(ARGV[3]) <= tonumber(g) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`)

var leaseReleaseScript = redis.NewScript(leaseReleaseLua)

// refreshBatch bounds one pipeline so a process with many streams sends several moderate
// pipelines rather than one enormous one.
const refreshBatch = 500

// refreshParallel bounds the pipelines one beat has out at once (each takes a connection of
// the pool).
const refreshParallel = 8

// inBatches calls send for each batch of refreshBatch of n items, [start, end), up to
// refreshParallel at a time, and joins their errors; a batch that fails does not keep the
// others from their beat. The batches go out together, not one after another: a beat has its
// interval for all of them, and behind a Redis whose every reply comes late (a swapping host,
// a slow fsync), one after another they ran past it with the later ones unsent — at every
// beat the same calls' leases and reservations went unstamped, and lapsed while their
// process lived. Together a beat costs the same round trips for 500 calls as for 4 000.
func inBatches(n int, send func(start, end int) error) error {
	batches := (n + refreshBatch - 1) / refreshBatch
	errs := make([]error, batches)
	slots := make(chan struct{}, refreshParallel)
	var wg sync.WaitGroup
	for i := range batches {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			errs[i] = send(i*refreshBatch, min((i+1)*refreshBatch, n))
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// heartbeat calls refresh every interval until ctx ends; a failed beat is logged, and the
// next one tries again.
func heartbeat(ctx context.Context, interval time.Duration, what string, refresh func(context.Context) error, log *zap.Logger) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			// Each beat ends by the next one's time: a beat Redis never answers (a client
			// without a read timeout of its own, read_timeout=-1) kept every later beat from
			// being sent, and the process's leases and reservations lapsed for good.
			bctx, cancel := context.WithTimeout(ctx, interval)
			err := refresh(bctx)
			cancel()
			if err != nil {
				log.Warn("heartbeat failed", zap.String("of", what), zap.Error(err))
			}
		}
	}
}
