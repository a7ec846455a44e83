package holds

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// Dead instances: a process killed mid-call leaves one-call holds that DESIGN §5 settles once
// they expire — hold_ttl, 15 minutes by default, during which the caller's in-flight slots
// stay taken (429 on every other process), an Idempotency-Key retry is answered 409
// request_in_progress and a session's message 409 already_running. Each serving process beats
// its row in `instances` (Instance); a pass that finds a beat older than the bound declares the
// row dead and brings in the expiry of the one-call holds it admitted while alive, and the
// pass's scan then reconciles them by the usual rules. Rule 1 guards each hold twice: one
// whose lease is in Redis is not brought in (its process lives after all — paused, or cut off
// from the database alone — or a call it left is still ending), and the scan checks again.

// maxDeadPerPass bounds the dead instances one pass sweeps: more wait for the next pass.
const maxDeadPerPass = 100

// sweepDead declares dead the instances whose beat stopped DeadAfter (or their own bound) ago,
// when this process's own beats show the database was there to beat on all that time, and
// brings in the unleased holds of dead instances not swept yet, until stopAt: a batch at a
// time, as the scan reads, at most MaxBatches batches. A dead instance is swept (never looked
// at again) once none of its holds is left live. It returns the instances it declared dead
// and the holds it brought in.
func (r *Reconciler) sweepDead(ctx context.Context, stopAt time.Time) (declared, brought int, err error) {
	ctx, cancel := context.WithDeadline(ctx, stopAt)
	defer cancel()
	declare := r.cfg.Self != nil && r.cfg.Self.BeatingFor() >= r.cfg.DeadAfter
	n, dead, err := r.cfg.Store.declareDead(ctx, declare, r.cfg.DeadAfter, maxDeadPerPass)
	declared = int(n)
	if declared > 0 && r.cfg.OnDeadInstances != nil {
		r.cfg.OnDeadInstances(declared)
	}
	if err != nil {
		return declared, 0, fmt.Errorf("sweep dead instances: %w", err)
	}
	batches := 0
	for _, d := range dead {
		got, left, err := r.sweepOne(ctx, d, &batches)
		brought += got
		if err != nil || left {
			return declared, brought, err
		}
	}
	if _, err := r.cfg.Store.pruneInstances(ctx, r.cfg.Batch); err != nil {
		return declared, brought, fmt.Errorf("sweep dead instances: %w", err)
	}
	return declared, brought, nil
}

// sweepOne brings in the unleased live holds of one dead instance and marks it swept when it
// has none left. left reports that this pass stopped before the end of its holds (the batch
// limit); the rest wait for the next pass.
func (r *Reconciler) sweepOne(ctx context.Context, d deadInstance, batches *int) (brought int, left bool, err error) {
	log := r.cfg.Log.Named(MoneyLog).With(zap.String("instance_id", d.ID), zap.String("instance", d.Name),
		zap.Time("beat_at", d.BeatAt), zap.Time("dead_at", d.DeadAt), zap.Bool("retired", d.Retired))
	leased, after := 0, ""
	for {
		if *batches >= r.cfg.MaxBatches {
			log.Info("reconcile: holds of a dead instance left for the next pass", zap.Int("brought_in", brought))
			return brought, true, nil
		}
		*batches++
		runs, err := r.cfg.Store.liveHoldsOf(ctx, d, after, r.cfg.Batch)
		if err != nil {
			return brought, false, fmt.Errorf("sweep dead instance %s: %w", d.ID, err)
		}
		for _, runID := range runs {
			after = runID
			ok, err := r.cfg.Leases.Exists(ctx, runID)
			if err != nil {
				return brought, false, fmt.Errorf("sweep dead instance %s: %w", d.ID, err)
			}
			if ok {
				// A live process serves it: left to its own expiry, which the scan extends
				// while the lease lives. The instance is looked at again next pass.
				leased++
				continue
			}
			if ok, err = r.cfg.Store.bringIn(ctx, runID, d.ID); err != nil {
				return brought, false, fmt.Errorf("sweep dead instance %s: %w", d.ID, err)
			} else if ok {
				brought++
			}
		}
		if len(runs) < r.cfg.Batch {
			break
		}
	}
	switch {
	case leased > 0:
		log.Info("reconcile: holds of a dead instance still leased; left to their expiry, looked at again next pass",
			zap.Int("leased", leased), zap.Int("brought_in", brought))
		return brought, false, nil
	case brought > 0 && !d.Retired:
		log.Warn("reconcile: instance found dead (its heartbeat stopped); its calls' holds brought in to be reconciled now",
			zap.Int("brought_in", brought))
	case brought > 0:
		log.Warn("reconcile: instance shut down leaving holds; brought in to be reconciled now", zap.Int("brought_in", brought))
	default:
		log.Info("reconcile: dead instance left no live hold")
	}
	if err := r.cfg.Store.markSwept(ctx, d.ID); err != nil {
		return brought, false, fmt.Errorf("sweep dead instance %s: %w", d.ID, err)
	}
	return brought, false, nil
}
