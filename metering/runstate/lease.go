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
}

// lease is this process's claim on one run.
type lease struct {
	calls int
	// written: a Refresh has taken the run since its first call here began, so its key may be
	// in Redis. A run never written has no key of this process's to delete: most calls end
	// well within a heartbeat, and their release then costs no round trip.
	written bool
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
	if err := leaseReleaseScript.Run(ctx, l.rdb, []string{l.keys.Lease(runID)}, l.instance).Err(); err != nil {
		return fmt.Errorf("release lease %s: %w", runID, err)
	}
	return nil
}

// Refresh writes every lease this process holds, in pipelines of refreshBatch. The heartbeat
// calls it; so may a caller that needs the keys written now.
func (l *Leases) Refresh(ctx context.Context) error {
	l.mu.Lock()
	ids := make([]string, 0, len(l.runs))
	for id, ls := range l.runs {
		ls.written = true // before the SET is sent: a Release from now on deletes the key
		ids = append(ids, id)
	}
	l.mu.Unlock()
	for start := 0; start < len(ids); start += refreshBatch {
		batch := ids[start:min(start+refreshBatch, len(ids))]
		_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range batch {
				p.Set(ctx, l.keys.Lease(id), l.instance, l.ttl)
			}
			return nil
		})
		if err != nil {
			err = fmt.Errorf("refresh %d leases: %w", len(batch), err)
			// Some SETs may have landed: a run released meanwhile must still lose its key.
			return errors.Join(err, l.dropReleasedAfter(ctx, ids))
		}
	}
	return l.dropReleasedAfter(ctx, ids)
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

// dropReleasedAfter is dropReleased on a deadline of its own: a beat whose SETs were
// answered after its deadline (a slow Redis) may have put back the key of a run released
// meanwhile, and on the beat's ended context the delete was never sent — the key stayed for
// the lease's TTL, the run looking served by a live process (its settle 409 run_busy, the
// reconciler extending it).
func (l *Leases) dropReleasedAfter(ctx context.Context, ids []string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropReleasedTimeout)
	defer cancel()
	return l.dropReleased(ctx, ids)
}

// dropReleasedTimeout bounds dropReleasedAfter's deletes: one round trip, as a tally write.
const dropReleasedTimeout = 2 * time.Second

// dropReleased deletes the lease keys of the runs among ids no longer held here.
func (l *Leases) dropReleased(ctx context.Context, ids []string) error {
	// A run released while Refresh's pipeline was on its way had its key deleted before a SET
	// put it back: it would then look served for a whole TTL (its run unsettleable, left
	// alone by the reconciler). Delete what is no longer held; a run acquired again meanwhile
	// is held and keeps its key, which its release must then delete: it is marked written.
	var gone []string
	l.mu.Lock()
	for _, id := range ids {
		if ls, held := l.runs[id]; held {
			ls.written = true
		} else {
			gone = append(gone, l.keys.Lease(id))
		}
	}
	l.mu.Unlock()
	if len(gone) == 0 {
		return nil
	}
	// One script per key (the keys live in different Cluster slots), sent whole: EVALSHA in a
	// pipeline cannot fall back on a script cache miss.
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, key := range gone {
			p.Eval(ctx, leaseReleaseLua, []string{key}, l.instance)
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
const leaseReleaseLua = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`

var leaseReleaseScript = redis.NewScript(leaseReleaseLua)

// refreshBatch bounds one pipeline so a process with many streams sends several moderate
// pipelines rather than one enormous one.
const refreshBatch = 500

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
