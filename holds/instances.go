package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/token"
)

// Instance is a serving process's row in `instances`: its heartbeat on the database clock, and
// the id it stamps on the holds it admits (run_holds.served_by). It is how the reconciler
// learns, minutes before a hold's expiry would tell it, that the process serving a call was
// killed: a row whose beat is older than its dead-instance bound is declared dead, and its
// one-call holds are reconciled early (Reconciler.sweepDead). The lease in Redis still has the
// last word over each hold (DESIGN §5 rule 1): a hold whose lease lives is not touched. So a
// process cut off from Redis alone, which goes on beating here, is never taken for dead, and
// one cut off from the database alone keeps its leases.
//
// A process that finds its row declared dead (a pause or a partition from both longer than
// the bound) registers a new id, used by its admissions from then on: what the reconciler
// brings in is only what the dead id admitted before it was declared dead.
type Instance struct {
	store     *Store
	name      string
	interval  time.Duration
	deadAfter time.Duration
	log       *zap.Logger
	id        atomic.Pointer[string]
	// retired: the row was marked dead by Retire; a beat after it must not register anew.
	retired atomic.Bool

	// mu guards the streak of beats that reached the database without a gap (BeatingFor).
	mu          sync.Mutex
	streakStart time.Time // local monotonic clock
	lastBeat    time.Time
}

// instanceBeatTimeout bounds one beat or registration: past it the beat is tried again at the
// next interval, and the bound the reconciler allows is several intervals.
const instanceBeatTimeout = 5 * time.Second

// RegisterInstance inserts this process's row and returns it; interval is how often Run beats,
// deadAfter this process's dead-instance bound (holds.dead_instance_after, checked against its
// own lease TTL and heartbeat), which every reconciler honours for this row whatever its own.
// Call it before serving: an admission before it would stamp no id.
func (s *Store) RegisterInstance(ctx context.Context, name string, interval, deadAfter time.Duration, log *zap.Logger) (*Instance, error) {
	if interval <= 0 || deadAfter < 0 {
		panic(fmt.Sprintf("holds: instance heartbeat every %v, dead after %v", interval, deadAfter))
	}
	in := &Instance{store: s, name: name, interval: interval, deadAfter: deadAfter, log: log}
	if err := in.register(ctx); err != nil {
		return nil, err
	}
	return in, nil
}

// ID is the id this process stamps on the holds it admits now.
func (in *Instance) ID() string { return *in.id.Load() }

// BeatingFor is how long this process's beats have reached the database without a gap (0 when
// the last one is overdue). Only a process that has beaten without a gap for the whole
// dead-instance bound may declare another dead: another's beat stale by that bound then says
// that process went silent, not that the database was down for everyone (after an outage of
// MySQL every beat is stale, and so would every live process look).
func (in *Instance) BeatingFor() time.Duration {
	in.mu.Lock()
	defer in.mu.Unlock()
	now := time.Now()
	if in.lastBeat.IsZero() || now.Sub(in.lastBeat) > in.gap() {
		return 0
	}
	return now.Sub(in.streakStart)
}

// gap is the longest silence between two beats that still counts as no gap: one beat may fail.
func (in *Instance) gap() time.Duration { return 2*in.interval + instanceBeatTimeout }

// beaten records a beat (or a registration) that reached the database.
func (in *Instance) beaten() {
	in.mu.Lock()
	defer in.mu.Unlock()
	now := time.Now()
	if in.lastBeat.IsZero() || now.Sub(in.lastBeat) > in.gap() {
		in.streakStart = now
	}
	in.lastBeat = now
}

// Run beats every interval until ctx ends. A beat that fails is logged and tried again at the
// next interval; one that finds the row declared dead registers a new one.
func (in *Instance) Run(ctx context.Context) {
	tick := time.NewTicker(in.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		bctx, cancel := context.WithTimeout(ctx, instanceBeatTimeout)
		err := in.Beat(bctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			in.log.Warn("instance heartbeat failed; tried again at the next beat", zap.String("instance_id", in.ID()), zap.Error(err))
		}
	}
}

// Beat refreshes the row's beat. A row declared dead (or deleted) is not revived: the
// reconciler may already have brought its holds in. A new row is registered instead, and
// admissions from now on carry its id.
func (in *Instance) Beat(ctx context.Context) error {
	if in.retired.Load() {
		return nil
	}
	id := in.ID()
	res, err := in.store.db.ExecContext(ctx, "UPDATE instances SET beat_at = NOW(6) WHERE id = ? AND dead_at IS NULL", id)
	if err != nil {
		return fmt.Errorf("instance %s beat: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("instance %s beat: %w", id, err)
	}
	if n == 0 {
		// MySQL counts only rows it changed: a beat in the same microsecond as the last one
		// changed nothing. Ask whether the row is still alive.
		var alive bool
		err := in.store.db.GetContext(ctx, &alive, "SELECT dead_at IS NULL FROM instances WHERE id = ?", id)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("instance %s beat: %w", id, err)
		}
		if alive {
			in.beaten()
			return nil
		}
	}
	if n == 1 {
		in.beaten()
		return nil
	}
	// Declared dead, or its row deleted (swept a day ago); or retired since this beat began.
	if in.retired.Load() {
		return nil
	}
	in.log.Error("this process was declared dead by a reconciler (its heartbeat had stopped for longer than holds.dead_instance_after); "+
		"calls it was serving may have been settled already from their tally or at their hold — someone should look",
		zap.String("instance_id", id), zap.String("instance", in.name))
	if err := in.register(ctx); err != nil {
		return fmt.Errorf("instance %s declared dead: %w", id, err)
	}
	in.log.Info("instance registered again", zap.String("instance_id", in.ID()), zap.String("previous_id", id))
	return nil
}

// Retire declares the row dead, at the end of a graceful shutdown, when the process has
// nothing in flight: a hold it leaves unsettled (a settlement that failed in the drain) is
// brought in by the next reconcile pass rather than at its expiry, once its lease has lapsed.
// Stop Run first; a beat after Retire does nothing.
func (in *Instance) Retire(ctx context.Context) error {
	in.retired.Store(true)
	id := in.ID()
	if _, err := in.store.db.ExecContext(ctx, "UPDATE instances SET dead_at = NOW(6), retired = 1 WHERE id = ? AND dead_at IS NULL", id); err != nil {
		return fmt.Errorf("instance %s retire: %w", id, err)
	}
	return nil
}

func (in *Instance) register(ctx context.Context) error {
	id := token.New()
	_, err := in.store.db.ExecContext(ctx, `INSERT INTO instances (id, name, started_at, beat_at, max_gap_us, dead_after_us)
		VALUES (?, ?, NOW(6), NOW(6), ?, ?)`, id, truncateName(in.name), in.gap().Microseconds(), in.deadAfter.Microseconds())
	if err != nil {
		return fmt.Errorf("register instance %s: %w", in.name, err)
	}
	in.id.Store(&id)
	in.beaten()
	return nil
}

// truncateName fits a configured instance name to its column (it is only a label).
func truncateName(name string) string {
	const maxName = 255
	if r := []rune(name); len(r) > maxName {
		return string(r[:maxName])
	}
	return name
}

// deadInstance is an instance row declared dead (or retired) and not yet swept.
type deadInstance struct {
	ID       string    `db:"id"`
	Name     string    `db:"name"`
	BeatAt   time.Time `db:"beat_at"`
	MaxGapUS int64     `db:"max_gap_us"`
	DeadAt   time.Time `db:"dead_at"`
	Retired  bool      `db:"retired"`
}

// lastAlive is the latest moment the process may have been alive and admitting: its last
// beat plus the gap its beats allow, or its declaration if that came sooner (a row retired
// at shutdown). A hold admitted after it shows the process was alive after its beats
// stopped: its beats failed, it did not die.
func (d deadInstance) lastAlive() time.Time {
	return minTime(d.DeadAt, d.BeatAt.Add(time.Duration(d.MaxGapUS)*time.Microsecond))
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// declareDead, when declare is set, marks dead every row whose beat is older than the longer
// of after and the row's own bound; it returns how many it marked, and the rows dead and not
// yet swept (these, earlier ones and those retired at shutdown), oldest first, at most limit.
func (s *Store) declareDead(ctx context.Context, declare bool, after time.Duration, limit int) (declared int64, dead []deadInstance, err error) {
	if declare {
		res, err := s.db.ExecContext(ctx, `UPDATE instances SET dead_at = NOW(6)
			WHERE dead_at IS NULL AND beat_at < NOW(6) - INTERVAL GREATEST(?, dead_after_us) MICROSECOND`, after.Microseconds())
		if err != nil {
			return 0, nil, fmt.Errorf("declare dead instances: %w", err)
		}
		if declared, err = res.RowsAffected(); err != nil {
			return 0, nil, fmt.Errorf("declare dead instances: %w", err)
		}
	}
	if err := s.db.SelectContext(ctx, &dead, `SELECT id, name, beat_at, max_gap_us, dead_at, retired FROM instances
		WHERE dead_at IS NOT NULL AND swept_at IS NULL ORDER BY dead_at, id LIMIT ?`, limit); err != nil {
		return declared, nil, fmt.Errorf("list dead instances: %w", err)
	}
	return declared, dead, nil
}

// liveHoldsOf lists up to limit one-call holds the dead instance admitted while it was alive
// (lastAlive) that have not expired, by run id after the given one. Those it admitted later
// wait for their expiry. Named runs are left alone: they live between their calls until
// run_ttl, and other processes may serve them. There is no index on served_by (every admission
// would pay for it): the live holds are read on the (state, expires_at) index, few.
func (s *Store) liveHoldsOf(ctx context.Context, dead deadInstance, after string, limit int) ([]string, error) {
	var runs []string
	if err := s.db.SelectContext(ctx, &runs, `SELECT run_id FROM run_holds
		WHERE state IN ('queued', 'running') AND expires_at > NOW(6) AND served_by = ? AND client_run_id IS NULL AND created_at < ?
		AND run_id > ? ORDER BY run_id LIMIT ?`, dead.ID, dead.lastAlive(), after, limit); err != nil {
		return nil, fmt.Errorf("holds of dead instance %s: %w", dead.ID, err)
	}
	return runs, nil
}

// bringIn brings in the expiry of one hold of a dead instance, so that the reconciler's expired
// scan handles it as it does any expired hold; it reports whether the hold was still live. It
// locks that one row for one statement, as Extend does: the batch transactions lock users
// before holds, and a statement holding several hold rows could wait on one of them while it
// holds another they want. Like Extend it takes no user lock: an admission's aggregate reads
// the hold's expiry before or after the change, either a state that was true (the hold still
// counts against the balance; only whether it takes an in-flight slot changes).
func (s *Store) bringIn(ctx context.Context, runID, deadID string) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE run_holds SET expires_at = LEAST(expires_at, NOW(6))
		WHERE run_id = ? AND served_by = ? AND state IN ('queued', 'running') AND client_run_id IS NULL`, runID, deadID)
	if err != nil {
		return false, fmt.Errorf("bring in %s of dead instance %s: %w", runID, deadID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("bring in %s of dead instance %s: %w", runID, deadID, err)
	}
	return n == 1, nil
}

// markSwept records that every hold of a dead instance has been brought in (or settled).
func (s *Store) markSwept(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, "UPDATE instances SET swept_at = NOW(6) WHERE id = ? AND swept_at IS NULL", id); err != nil {
		return fmt.Errorf("mark dead instance %s swept: %w", id, err)
	}
	return nil
}

// InstanceKeep is how long the row of a dead instance is kept after its sweep, for an operator
// asking which process died when (and so that the process, if it was only paused, finds its
// row dead rather than gone; either way it registers anew).
const InstanceKeep = 24 * time.Hour

// pruneInstances deletes up to limit rows swept more than InstanceKeep ago.
func (s *Store) pruneInstances(ctx context.Context, limit int) (int64, error) {
	res, err := s.db.ExecContext(ctx, "DELETE FROM instances WHERE swept_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT ?",
		InstanceKeep.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("prune dead instances: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("prune dead instances: %w", err)
	}
	return n, nil
}

// InstanceRow is one row of `instances`, as tests and operators read it.
type InstanceRow struct {
	ID      string       `db:"id"`
	Name    string       `db:"name"`
	BeatAt  time.Time    `db:"beat_at"`
	DeadAt  sql.NullTime `db:"dead_at"`
	SweptAt sql.NullTime `db:"swept_at"`
}

// Instances lists the instance rows, newest beat first, at most limit.
func (s *Store) Instances(ctx context.Context, limit int) ([]InstanceRow, error) {
	var out []InstanceRow
	if err := s.db.SelectContext(ctx, &out, "SELECT id, name, beat_at, dead_at, swept_at FROM instances ORDER BY beat_at DESC, id LIMIT ?", limit); err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	return out, nil
}
