package holds

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Dead instances: a process killed mid-call leaves one-call holds that DESIGN §5 settles once
// they expire — hold_ttl, 15 minutes by default, during which the caller's in-flight slots
// stay taken (429 on every other process), an Idempotency-Key retry is answered 409
// request_in_progress and a session's message 409 already_running. Each serving process beats
// its row in `instances` (Instance) and watches the others' beats; a pass that finds a beat
// older than the bound by the database clock, and standing still for longer than its gap by the
// passing process's own, declares the row dead and brings in the expiry of the one-call holds
// it admitted while alive, and the pass's scan then reconciles them by the usual rules. Rule 1 guards each hold twice: one
// whose lease is in Redis is not brought in (its process lives after all — paused, or cut off
// from the database alone — or a call it left is still ending), and the scan checks again.

// maxDeadPerPass bounds the dead instances one pass declares and sweeps: more wait for the next
// pass (a variable for tests).
var maxDeadPerPass = 100

// deadInstance is an instance row declared dead (or retired) and not yet swept.
type deadInstance struct {
	ID       string    `db:"id"`
	Name     string    `db:"name"`
	BeatAt   time.Time `db:"beat_at"`
	MaxGapUS int64     `db:"max_gap_us"`
	DeadAt   time.Time `db:"dead_at"`
	Retired  bool      `db:"retired"`
}

// deadCursor is a position in the dead rows' order (dead_at, id); the zero value is before the
// first.
type deadCursor struct {
	DeadAt time.Time
	ID     string
}

// sweepDead declares dead the instances whose beat stopped DeadAfter (or their own bound) ago,
// when this process's own beats show the database was there to beat on all that time and it
// has watched their beat stand still (Instance.watch), and
// brings in the unleased holds of dead instances not swept yet, until stopAt: a batch at a
// time, as the scan reads, at most MaxBatches batches. A dead instance is swept (never looked
// at again) once none of its holds is left live. It returns the instances it declared dead
// and the holds it brought in.
//
// The dead rows are read from where the last pass left off (deadResume), as the scan reads the
// expired holds: a row kept unswept by leased holds (its process alive, cut off from the
// database) is passed over until the rows reach their end, so a window of such rows cannot keep
// the dead rows behind it from ever being swept.
func (r *Reconciler) sweepDead(ctx context.Context, stopAt time.Time) (declared, brought int, err error) {
	ctx, cancel := context.WithDeadline(ctx, stopAt)
	defer cancel()
	self, still := "", []stillBeat(nil)
	if r.cfg.Self != nil && r.cfg.Self.BeatingFor() >= r.cfg.DeadAfter {
		if err := r.cfg.Self.watch(ctx); err != nil {
			return 0, 0, fmt.Errorf("sweep dead instances: %w", err)
		}
		self, still = r.cfg.Self.ID(), r.cfg.Self.still()
	}
	n, err := r.cfg.Store.declareDead(ctx, self, still, r.cfg.DeadAfter, maxDeadPerPass)
	declared = int(n)
	if declared > 0 && r.cfg.OnDeadInstances != nil {
		r.cfg.OnDeadInstances(declared)
	}
	if err != nil {
		return declared, 0, fmt.Errorf("sweep dead instances: %w", err)
	}
	r.mu.Lock()
	after := r.deadResume
	r.mu.Unlock()
	dead, err := r.cfg.Store.deadInstances(ctx, after, maxDeadPerPass)
	if err != nil {
		return declared, 0, fmt.Errorf("sweep dead instances: %w", err)
	}
	batches := 0
	for i, d := range dead {
		got, left, err := r.sweepOne(ctx, d, &batches)
		brought += got
		if err != nil || left {
			// This row first, next pass: the rest of its holds wait for it. Unless it had this
			// pass to itself and still stopped it (its leased holds alone fill the batches or
			// the time): the rows behind it go first, and it comes round again with the rest.
			if i == 0 && (left || ctx.Err() != nil) {
				after = deadCursor{DeadAt: d.DeadAt, ID: d.ID}
			}
			r.resumeDeadAt(after)
			return declared, brought, err
		}
		after = deadCursor{DeadAt: d.DeadAt, ID: d.ID}
	}
	if len(dead) < maxDeadPerPass {
		after = deadCursor{} // the end: the next pass starts again from the oldest
	}
	r.resumeDeadAt(after)
	if _, err := r.cfg.Store.pruneInstances(ctx, r.cfg.Batch); err != nil {
		return declared, brought, fmt.Errorf("sweep dead instances: %w", err)
	}
	return declared, brought, nil
}

// sweepOne brings in the unleased live holds of one dead instance and marks it swept when it
// has none left. left reports that this pass stopped before the end of its holds (the batch
// limit); the rest wait for the next pass, which reads on from where this one stopped
// (holdsResume), as it does after a pass stopped by the sweep's time or a failure: read from
// the first each pass, more leased holds than a pass reads would keep the unleased ones after
// them from ever being brought in. A row kept unswept by leased holds
// is read again each pass, until its calls end (a paused process's, or one cut off from the
// database); it is swept only by a pass that read all its holds and found none leased.
func (r *Reconciler) sweepOne(ctx context.Context, d deadInstance, batches *int) (brought int, left bool, err error) {
	log := r.cfg.Log.Named(MoneyLog).With(zap.String("dead_instance_id", d.ID), zap.String("dead_instance", d.Name),
		zap.Time("beat_at", d.BeatAt), zap.Time("dead_at", d.DeadAt), zap.Bool("retired", d.Retired))
	start := r.holdsResumeOf(d.ID)
	leased, after := 0, start
	for {
		if *batches >= r.cfg.MaxBatches {
			r.resumeHoldsAt(d.ID, after)
			log.Info("reconcile: holds of a dead instance left for the next pass", zap.Int("brought_in", brought), zap.String("after_run", after))
			return brought, true, nil
		}
		*batches++
		runs, err := r.cfg.Store.liveHoldsOf(ctx, d, after, r.cfg.Batch)
		if err != nil {
			// Stopped by the sweep's time (or a failure) as by its batch limit: the next pass
			// reads on from the last whole batch, or one that runs out of time at the same
			// leased hold every pass never reaches the holds after it.
			r.resumeHoldsAt(d.ID, after)
			return brought, false, err
		}
		b, l, err := r.bringInUnleased(ctx, d, runs)
		brought, leased = brought+b, leased+l
		if err != nil {
			if errors.Is(err, errNoLeaseRead) && ctx.Err() == nil {
				// An outage, or a batch of holds whose leases keep failing: the next pass goes
				// on after it, as the scan does after a batch of which every hold failed, or
				// such a batch heading the row stopped every pass there.
				after = runs[len(runs)-1]
			}
			r.resumeHoldsAt(d.ID, after)
			return brought, false, err
		}
		if len(runs) > 0 {
			after = runs[len(runs)-1]
		}
		if len(runs) < r.cfg.Batch {
			break
		}
	}
	r.resumeHoldsAt(d.ID, "") // the end: the next pass reads this row's holds from the first
	if brought > 0 {
		msg := "reconcile: instance found dead (its heartbeat stopped); its calls' holds brought in to be reconciled now"
		if d.Retired {
			msg = "reconcile: instance shut down leaving holds; brought in to be reconciled now"
		}
		log.Warn(msg, zap.Int("brought_in", brought))
	}
	switch {
	case leased > 0:
		log.Debug("reconcile: holds of a dead instance still leased; left to their expiry, looked at again next pass",
			zap.Int("leased", leased))
		return brought, false, nil
	case start != "":
		// The holds before start, read by earlier passes, may have been leased: the next
		// pass reads them all again before the row is swept.
		log.Debug("reconcile: holds of a dead instance read to their end from where the last pass stopped")
		return brought, false, nil
	case brought == 0:
		log.Info("reconcile: dead instance left no live hold")
	}
	return brought, false, r.cfg.Store.markSwept(ctx, d.ID)
}

// bringInUnleased brings in the holds of runs (one batch of a dead instance's) that no lease
// keeps, and counts those it brought in and those a lease kept.
//
// A hold whose lease cannot be read is kept as a leased one is, left to its expiry, and the
// holds after it are read on: one lease that kept failing (its key on a Redis Cluster shard
// that is down) stopped every pass's sweep there, and no dead instance's holds behind it were
// brought in. A batch of which no lease could be read (Redis out of reach) fails with
// errNoLeaseRead; one the sweep's time ends fails with ctx's error.
func (r *Reconciler) bringInUnleased(ctx context.Context, d deadInstance, runs []string) (brought, leased int, err error) {
	var unread []error
	for _, runID := range runs {
		hasLease, err := r.cfg.Leases.Exists(ctx, runID)
		if err != nil {
			if ctx.Err() != nil {
				return brought, leased, fmt.Errorf("sweep dead instance %s: %w", d.ID, err) // the sweep's time
			}
			leased++
			unread = append(unread, fmt.Errorf("run %s: %w", runID, err))
			continue
		}
		if hasLease {
			// A live process serves it (the dead one paused, or cut off from the database,
			// or a call it left still ending): left to its own expiry, which the scan
			// extends while the lease lives.
			leased++
			continue
		}
		live, err := r.cfg.Store.bringIn(ctx, runID, d.ID)
		if err != nil {
			return brought, leased, err
		}
		if live {
			brought++
		}
	}
	switch {
	case len(unread) > 0 && len(unread) == len(runs):
		return brought, leased, fmt.Errorf("sweep dead instance %s: %w: %w", d.ID, errNoLeaseRead, unread[0])
	case len(unread) > 0:
		r.cfg.Log.Named(MoneyLog).Warn("reconcile: leases of a dead instance's holds not read; those holds are left to their expiry",
			zap.String("dead_instance_id", d.ID), zap.Int("unread", len(unread)), zap.Error(unread[0]))
	}
	return brought, leased, nil
}

// errNoLeaseRead is a batch of a dead instance's holds of which no lease could be read
// (bringInUnleased).
var errNoLeaseRead = errors.New("no lease of the batch's holds could be read")

// declareDead, when self names the declaring process, marks dead each row of still (the rows
// whose beat self has watched stand still for longer than their gap) whose beat is still the
// one watched and is older than the longer of after and the row's own bound, at most limit of
// them, and returns how many it marked. Both clocks must agree: the database's says the beat is
// older than the bound, self's own that it has not moved for longer than a live process's
// beats may be apart. The database clock alone, stepped forward past the bound, makes every
// beat look stale; so self's own row must also have beaten within its gap by the database
// clock (a step before its last beat), and a live row beats again within its gap, which self
// sees (a step after it).
func (s *Store) declareDead(ctx context.Context, self string, still []stillBeat, after time.Duration, limit int) (int64, error) {
	if self == "" || len(still) == 0 {
		return 0, nil
	}
	var fresh bool
	if err := s.db.GetContext(ctx, &fresh, `SELECT COUNT(*) > 0 FROM instances
		WHERE id = ? AND dead_at IS NULL AND beat_at >= NOW(6) - INTERVAL max_gap_us MICROSECOND`, self); err != nil {
		return 0, fmt.Errorf("declare dead instances: own beat: %w", err)
	}
	if !fresh {
		return 0, nil
	}
	return s.markDead(ctx, still[:min(len(still), limit)], after)
}

// deadInstances lists the rows dead and not yet swept (declared by any pass, or retired at
// shutdown) after the cursor, oldest declaration first, at most limit.
func (s *Store) deadInstances(ctx context.Context, after deadCursor, limit int) ([]deadInstance, error) {
	var dead []deadInstance
	if err := s.db.SelectContext(ctx, &dead, `SELECT id, name, beat_at, max_gap_us, dead_at, retired FROM instances
		WHERE dead_at IS NOT NULL AND swept_at IS NULL AND (dead_at > ? OR (dead_at = ? AND id > ?))
		ORDER BY dead_at, id LIMIT ?`, after.DeadAt, after.DeadAt, after.ID, limit); err != nil {
		return nil, fmt.Errorf("list dead instances: %w", err)
	}
	return dead, nil
}

// markDead marks dead, in one statement, the rows of still whose beat is the one watched and
// older than the longer of after and the row's own bound.
func (s *Store) markDead(ctx context.Context, still []stillBeat, after time.Duration) (int64, error) {
	args := make([]any, 0, 1+2*len(still))
	args = append(args, after.Microseconds())
	for _, b := range still {
		args = append(args, b.ID, b.BeatAt)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE instances SET dead_at = NOW(6)
		WHERE dead_at IS NULL AND beat_at < NOW(6) - INTERVAL GREATEST(?, dead_after_us) MICROSECOND
		AND (id, beat_at) IN (`+strings.Repeat("(?, ?), ", len(still)-1)+`(?, ?))`, args...)
	if err != nil {
		return 0, fmt.Errorf("declare dead instances: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("declare dead instances: %w", err)
	}
	return n, nil
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

// liveHoldsOf lists up to limit one-call holds the dead instance admitted while it was alive
// (lastAlive) that have not expired, by run id after the given one. Those it admitted later
// wait for their expiry. Named runs are left alone: they live between their calls until
// run_ttl, and other processes may serve them. There is no index on served_by (every admission
// and settlement would pay for it): each dead row not yet swept reads the unexpired live holds
// on the (state, expires_at) index, a row lookup each — a cost that grows with the calls in
// flight and the named runs alive, not with the table — once a pass.
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
//
// A refusal for want of room (1114, 1021), read_only, a lost connection or a lock wait is tried
// again until ctx ends, the sweep's time (withRoomRetry): the row changes in place, but the
// expiry it moves is a key of idx_run_holds_state_expires, whose new entry must grow the table
// once its page is full, and given up at once the sweep stopped there, the holds after it
// keeping their callers' in-flight slots until the next pass. The statement only moves the
// expiry back to now, so one whose reply was lost is safe to send again: sent again, it finds
// the hold already in and changes nothing, so it reports the hold not live, which only the
// pass's BroughtIn count misses (the scan settles the hold all the same). A refusal for room
// landed nothing. Each try is logged with the run's and the dead instance's ids.
func (s *Store) bringIn(ctx context.Context, runID, deadID string) (bool, error) {
	var live bool
	err := s.withRoomRetry(ctx, "bring in", []zap.Field{zap.String("run_id", runID), zap.String("dead_instance_id", deadID)}, func() error {
		res, err := s.db.ExecContext(ctx, `UPDATE run_holds SET expires_at = LEAST(expires_at, NOW(6))
			WHERE run_id = ? AND served_by = ? AND state IN ('queued', 'running') AND client_run_id IS NULL`, runID, deadID)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		live = n == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("bring in %s of dead instance %s: %w", runID, deadID, err)
	}
	return live, nil
}

// holdsResumeOf is the run id after which the next read of the dead row id's holds starts:
// "" (the first) unless the last pass to read them stopped inside them.
func (r *Reconciler) holdsResumeOf(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holdsResume[id]
}

// resumeHoldsAt records where the next read of the dead row id's holds starts: after run, or
// from the first when run is "". Rows swept by another process leave their entries behind, so
// a full map starts over (costing those rows some passes' progress, never a hold).
func (r *Reconciler) resumeHoldsAt(id, run string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if run == "" {
		delete(r.holdsResume, id)
		return
	}
	if _, kept := r.holdsResume[id]; !kept && len(r.holdsResume) >= maxDeadPerPass {
		clear(r.holdsResume)
	}
	if r.holdsResume == nil {
		r.holdsResume = map[string]string{}
	}
	r.holdsResume[id] = run
}

// resumeDeadAt is where the next pass reads the dead rows from.
func (r *Reconciler) resumeDeadAt(c deadCursor) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deadResume = c
}

// markSwept records that every hold of a dead instance has been brought in (or settled).
func (s *Store) markSwept(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, "UPDATE instances SET swept_at = NOW(6) WHERE id = ? AND swept_at IS NULL", id); err != nil {
		return fmt.Errorf("mark dead instance %s swept: %w", id, err)
	}
	return nil
}

// instanceKeep is how long the row of a dead instance is kept after its sweep, for an operator
// asking which process died when (and so that the process, if it was only paused, finds its
// row dead rather than gone; either way it registers anew).
const instanceKeep = 24 * time.Hour

// pruneInstances deletes up to limit rows swept more than instanceKeep ago.
func (s *Store) pruneInstances(ctx context.Context, limit int) (int64, error) {
	res, err := s.db.ExecContext(ctx, "DELETE FROM instances WHERE swept_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT ?",
		instanceKeep.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("prune dead instances: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("prune dead instances: %w", err)
	}
	return n, nil
}
