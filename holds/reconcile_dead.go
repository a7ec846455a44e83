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
// its row in `instances` (Instance); a pass that finds a beat older than DeadAfter declares the
// row dead and brings in the expiry of the one-call holds it admitted before that, and the
// pass's scan then reconciles them by the usual rules. Rule 1 still guards each: a lease found
// in Redis means its process is alive after all (paused, or cut off from the database alone),
// and the hold is extended, not settled.

// maxDeadPerPass bounds the dead instances one pass sweeps: more wait for the next pass.
const maxDeadPerPass = 100

// sweepDead declares dead the instances whose beat stopped DeadAfter ago (when this process's
// own beats show the database was there to beat on all that time), and brings in the
// holds of dead instances not swept yet, until stopAt: a batch at a time, as the scan reads,
// at most MaxBatches batches. It returns the instances it declared dead and the holds it
// brought in.
func (r *Reconciler) sweepDead(ctx context.Context, stopAt time.Time) (declared, brought int, err error) {
	ctx, cancel := context.WithDeadline(ctx, stopAt.Add(reconcileItemTimeout))
	defer cancel()
	declare := r.cfg.Self != nil && r.cfg.Self.BeatingFor() >= r.cfg.DeadAfter
	n, dead, err := r.cfg.Store.declareDead(ctx, declare, r.cfg.DeadAfter, maxDeadPerPass)
	declared = int(n)
	if err != nil {
		return declared, 0, fmt.Errorf("sweep dead instances: %w", err)
	}
	batches := 0
	for _, d := range dead {
		log := r.cfg.Log.Named(MoneyLog).With(zap.String("instance_id", d.ID), zap.String("instance", d.Name),
			zap.Time("beat_at", d.BeatAt), zap.Time("dead_at", d.DeadAt))
		ofThis := 0
		for {
			if batches >= r.cfg.MaxBatches || (batches > 0 && time.Now().After(stopAt)) {
				log.Info("reconcile: holds of a dead instance left for the next pass", zap.Int("brought_in", ofThis))
				return declared, brought, nil
			}
			batches++
			got, found, err := r.cfg.Store.bringInHolds(ctx, d, r.cfg.Batch)
			brought, ofThis = brought+got, ofThis+got
			if err != nil {
				return declared, brought, fmt.Errorf("sweep dead instance %s: %w", d.ID, err)
			}
			if found < r.cfg.Batch {
				break
			}
		}
		if err := r.cfg.Store.markSwept(ctx, d.ID); err != nil {
			return declared, brought, fmt.Errorf("sweep dead instance %s: %w", d.ID, err)
		}
		if ofThis > 0 {
			log.Warn("reconcile: instance dead (its heartbeat stopped, or it left holds at shutdown); its calls' holds brought in to be reconciled now",
				zap.Int("brought_in", ofThis), zap.Duration("dead_after", r.cfg.DeadAfter))
		} else {
			log.Info("reconcile: instance dead or shut down; it left no hold")
		}
		if r.cfg.OnDeadInstance != nil {
			r.cfg.OnDeadInstance()
		}
	}
	if _, err := r.cfg.Store.pruneInstances(ctx, r.cfg.Batch); err != nil {
		return declared, brought, fmt.Errorf("sweep dead instances: %w", err)
	}
	return declared, brought, nil
}
