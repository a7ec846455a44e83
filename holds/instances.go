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

	// seenMu guards seen: the other live rows' beats as this process last read them (watch).
	seenMu sync.Mutex
	seen   map[string]seenBeat
	// twins: the rows under this process's own name seen beating (reportTwin), each
	// reported once; forgotten once the row leaves the watch (retired, declared dead).
	twins map[string]bool
	// onTwins, when set (OnTwins), is told after each watch how many rows under this
	// process's own name it saw beat since the watch before.
	onTwins func(n int)
	// skew moves the watch's clock on, in tests only (export_test.go).
	skew atomic.Int64
	// beatSkew moves the clock of the beat streak on, in tests only (export_test.go): a gap in
	// the beats is otherwise seconds of waiting.
	beatSkew atomic.Int64
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
		if err != nil && ctx.Err() == nil {
			in.log.Warn("instance heartbeat failed; tried again at the next beat", zap.String("instance_id", in.ID()), zap.Error(err))
		}
		if err == nil && !in.retired.Load() {
			if err := in.watch(bctx); err != nil && ctx.Err() == nil {
				in.log.Warn("reading the other instances' beats failed; read again at the next beat (and by each pass before it declares any dead)",
					zap.String("instance_id", in.ID()), zap.Error(err))
			}
		}
		cancel()
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
		in.dropReadOnly(err)
		return fmt.Errorf("instance %s beat: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("instance %s beat: rows changed: %w", id, err)
	}
	alive := n == 1
	if !alive {
		// MySQL counts only rows it changed: a beat in the same microsecond as the last one
		// changed nothing. Ask whether the row is still alive.
		err := in.store.db.GetContext(ctx, &alive, "SELECT dead_at IS NULL FROM instances WHERE id = ?", id)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("instance %s beat: is the row alive: %w", id, err)
		}
	}
	if alive {
		in.beaten()
		return nil
	}
	// Declared dead, or its row deleted (swept a day ago); or retired since this beat began.
	if in.retired.Load() {
		return nil
	}
	in.log.Error("this process was declared dead by a reconciler (its heartbeat had stopped for longer than holds.dead_instance_after); "+
		"calls it was serving may have been settled already from their tally or at their hold — someone should look",
		zap.String("instance_id", id))
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

// BeatingFor is how long this process's beats have reached the database without a gap (0 when
// the last one is overdue). Only a process that has beaten without a gap for the whole
// dead-instance bound may declare another dead: another's beat stale by that bound then says
// that process went silent, not that the database was down for everyone (after an outage of
// MySQL every beat is stale, and so would every live process look).
func (in *Instance) BeatingFor() time.Duration {
	in.mu.Lock()
	defer in.mu.Unlock()
	now := in.beatNow()
	if in.lastBeat.IsZero() || now.Sub(in.lastBeat) > in.gap() {
		return 0
	}
	return now.Sub(in.streakStart)
}

// OnTwins has f told, after each watch (each heartbeat, and each reconcile pass before it
// declares any row dead), how many live processes serve under this process's own instance
// name: the rows under it whose beat a watch saw move within the row's gap (max_gap_us, the
// longest a live process's beat stands still). Counted only at the watch that saw the move,
// it fell to 0 at a reconcile pass's watch right after the heartbeat's, before the twin beat
// again, and the gauge flickered under an alert's "for" window. It is 0 as it should be; a
// twin is logged once (reportTwin), and f lets it be watched for as long as it lasts (the
// gateway's tollgate_instance_twins). A twin killed drops out once its gap has passed, one
// stopped and retired at the next watch.
func (in *Instance) OnTwins(f func(n int)) {
	in.seenMu.Lock()
	defer in.seenMu.Unlock()
	in.onTwins = f
}

// seenBeat is another row's beat as this process read it: since is when (local monotonic
// clock) it first read that beat, gap how long that row's beats may be apart.
type seenBeat struct {
	beatAt time.Time
	since  time.Time
	gap    time.Duration
	// moved is when a watch last saw the beat move (zero: not yet, as for a row first read, a
	// killed process's standing still): a twin is one that moved within its gap.
	moved time.Time
}

// stillBeat is a row whose beat this process has watched stand still for longer than its gap.
type stillBeat struct {
	ID     string
	BeatAt time.Time
}

// maxWatched bounds the rows one watch reads: the oldest beats first, those a pass may declare
// dead.
const maxWatched = 1000

// watch reads the beats of the other live rows and remembers, for each, since when (by this
// process's own clock) it has read the same beat. A reconcile pass declares dead only a row
// whose beat this process has seen stand still for longer than the gap its beats allow (still):
// the database clock alone would take a clock stepped forward for a silence, and declare live
// processes dead, their calls younger than a heartbeat charged as a killed one's. Run watches
// after each beat, so the view is as fresh as the heartbeat whichever process holds the
// reconcile lock, and a pass watches again before it declares.
func (in *Instance) watch(ctx context.Context) error {
	var rows []struct {
		ID       string    `db:"id"`
		Name     string    `db:"name"`
		BeatAt   time.Time `db:"beat_at"`
		MaxGapUS int64     `db:"max_gap_us"`
	}
	if err := in.store.db.SelectContext(ctx, &rows, `SELECT id, name, beat_at, max_gap_us FROM instances
		WHERE dead_at IS NULL AND id <> ? ORDER BY beat_at, id LIMIT ?`, in.ID(), maxWatched); err != nil {
		return fmt.Errorf("instance %s watch: %w", in.ID(), err)
	}
	now := in.watchNow()
	in.seenMu.Lock()
	defer in.seenMu.Unlock()
	seen := make(map[string]seenBeat, len(rows)) // rows gone (declared, retired) are forgotten
	twins := 0
	for _, r := range rows {
		b, ok := in.seen[r.ID]
		if !ok || !b.beatAt.Equal(r.BeatAt) {
			moved := b.moved
			if ok {
				moved = now
			}
			b = seenBeat{beatAt: r.BeatAt, since: now, moved: moved}
		}
		b.gap = time.Duration(r.MaxGapUS) * time.Microsecond
		if !b.moved.IsZero() && now.Sub(b.moved) <= b.gap && r.Name == truncateName(in.name) {
			twins++
			if !in.twins[r.ID] {
				in.reportTwin(r.ID)
			}
		}
		seen[r.ID] = b
	}
	in.seen = seen
	// A twin reported is remembered while its row is watched: one restarted again and again
	// registers a new row each time, and remembered for good each start grew the map for the
	// life of this process.
	for id := range in.twins {
		if _, ok := seen[id]; !ok {
			delete(in.twins, id)
		}
	}
	if in.onTwins != nil {
		in.onTwins(twins)
	}
	return nil
}

// reportTwin says, once per row, that a row under this process's own instance name beat while
// this process watched it: another live process serves under the name. README asks for one name
// per live process, since the name is what leases and the reconcile lock are held under (one's
// lease release deletes a lease the other wrote; with their clocks apart one refuses the
// other's lease writes for a lease TTL). A row whose beat stands still is a killed process's
// that this one was restarted to replace, which is fine, and is not reported. Called with
// seenMu held.
func (in *Instance) reportTwin(id string) {
	if in.twins == nil {
		in.twins = map[string]bool{}
	}
	in.twins[id] = true
	in.log.Error("another live gateway process serves under this instance name (TOLLGATE_INSTANCE); "+
		"give each live process its own: the two share their leases and the reconcile lock",
		zap.String("name", in.name), zap.String("instance_id", in.ID()), zap.String("other_instance_id", id))
}

// still lists the rows whose beat this process has watched stand still for longer than the gap
// their beats allow, as of its last watch.
func (in *Instance) still() []stillBeat {
	now := in.watchNow()
	in.seenMu.Lock()
	defer in.seenMu.Unlock()
	var still []stillBeat
	for id, b := range in.seen {
		if now.Sub(b.since) > b.gap {
			still = append(still, stillBeat{ID: id, BeatAt: b.beatAt})
		}
	}
	return still
}

func (in *Instance) watchNow() time.Time { return time.Now().Add(time.Duration(in.skew.Load())) }

func (in *Instance) beatNow() time.Time { return time.Now().Add(time.Duration(in.beatSkew.Load())) }

// gap is the longest silence between two beats that still counts as no gap: one beat may fail.
func (in *Instance) gap() time.Duration { return BeatGap(in.interval) }

// BeatGap is the gap (Instance.gap) of a process beating every interval: a hold it admitted up
// to that long after its last beat is still brought in when it is declared dead, so such a hold
// may be charged as soon as its bound less this after its admission.
func BeatGap(interval time.Duration) time.Duration { return 2*interval + instanceBeatTimeout }

// beaten records a beat (or a registration) that reached the database.
func (in *Instance) beaten() {
	in.mu.Lock()
	defer in.mu.Unlock()
	now := in.beatNow()
	if in.lastBeat.IsZero() || now.Sub(in.lastBeat) > in.gap() {
		in.streakStart = now
	}
	in.lastBeat = now
}

// register inserts a row under a new id and makes it the one admissions stamp, bounded by
// instanceBeatTimeout as a beat is.
func (in *Instance) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, instanceBeatTimeout)
	defer cancel()
	id := token.New()
	_, err := in.store.db.ExecContext(ctx, `INSERT INTO instances (id, name, started_at, beat_at, max_gap_us, dead_after_us)
		VALUES (?, ?, NOW(6), NOW(6), ?, ?)`, id, truncateName(in.name), in.gap().Microseconds(), in.deadAfter.Microseconds())
	if err != nil {
		in.dropReadOnly(err)
		return fmt.Errorf("register instance %s: %w", in.name, err)
	}
	in.id.Store(&id)
	in.beaten()
	return nil
}

// dropReadOnly closes the pool's idle connections, the refused one with them, when err is a
// write refused read_only (isReadOnly), as a batch's refusal does (Store.dropReadOnly): after
// a failover they lead to the demoted primary. Kept, the refused connection was drawn again by
// the next beat — the pool hands out the connection returned last — and a process serving no
// call, whose readyz nobody polled, beat against the demoted server until the connection's
// lifetime ran out (5 minutes), long enough for a process on the promoted one to declare it
// dead.
func (in *Instance) dropReadOnly(err error) {
	if isReadOnly(err) {
		in.store.closeIdle()
	}
}

// truncateName fits a configured instance name to its column (it is only a label).
func truncateName(name string) string {
	const maxName = 255
	if r := []rune(name); len(r) > maxName {
		return string(r[:maxName])
	}
	return name
}
