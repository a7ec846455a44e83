package proxy

import (
	"bytes"
	"context"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
	"go.uber.org/zap"
)

// tallyBeforeAnswer tallies a call of a named run whose answer is complete (or broken off, its
// error event still to go) but whose end the caller has not been sent yet: a caller that
// settles its run the moment the answer ends must find the call in the run's tally, not get
// 409 run_busy for a call it saw finish.
func (s *Server) tallyBeforeAnswer(ctx context.Context, c *call) {
	ctx = context.WithoutCancel(ctx)
	st := s.settlementOf(c)
	// A failed write is tried again when the call ends, then until settle_timeout (finishRunCall;
	// a named run's steps are safe to repeat): the tally is the run's only record of the call.
	// First, since it gives the call's reservation back: a call of the run reserving while the
	// row already recorded this one and its reservation still stood would count it twice (the
	// run's budget counts the row's record as spent, Hold.RecordedMicro), and be refused with
	// the cap half unused.
	c.tallied = s.tallyCall(ctx, c, st)
	// The run's row records the call before its end reaches the caller too: after a Redis
	// restart the tally has only the calls made since, and a settle sent the moment the answer
	// ends, reading a row without this call, would charge the larger of the two records rather
	// than both calls (and the call's record would then find its run settled). A settle that
	// comes between the two writes finds the call still in flight (its tally's record-to-come
	// mark, runstate.RunBudget.ReleaseBeforeRecord, on a run whose Redis record lost calls)
	// and is refused run_busy.
	s.recordRunCall(ctx, c, st)
	// The call is over but for its last bytes; a run settled now must not find its lease
	// (CloseRun refuses a leased run).
	s.releaseLease(ctx, c)
}

// tallyCall records a call's usage in Redis: if this process dies before the call's
// settlement commits, the reconciler settles from the tally. It need not precede the
// settlement: an applied settlement makes the tally moot, and one that fails leaves its run
// to the reconciler only once its hold has expired (minutes), long after this write (bounded
// by tallyWriteTimeout) has landed or failed. Only a crash before the write lands loses it,
// the same window as writing it first.
//
// A call that used nothing (refused, duplicate, upstream error) records that it used nothing:
// without a tally the reconciler would charge a run whose release at 0 failed what it held.
func (s *Server) tallyCall(ctx context.Context, c *call, st holds.Settlement) (ok bool) {
	tctx, cancel := context.WithTimeout(ctx, tallyWriteTimeout)
	defer cancel()
	var err error
	switch {
	case c.reserving && !c.recorded:
		// Its record on the run's row follows (recordRunCall): the run is not settled between.
		c.recordMarked, err = s.budgets.ReleaseBeforeRecord(tctx, c.runID, c.callID, st.Usage, st.CostMicro, st.Estimated)
		c.recordMarkUnknown = err != nil
	case c.reserving:
		err = s.budgets.Release(tctx, c.runID, c.callID, st.Usage, st.CostMicro, st.Estimated)
		if err == nil && c.recordMarkUnknown {
			s.dropRecordMark(tctx, c)
		}
	case st.CostMicro == 0 && st.Usage == (pricing.Usage{}) && c.inRun:
		err = s.tally.MarkRunCallUnused(tctx, c.runID)
	case st.CostMicro == 0 && st.Usage == (pricing.Usage{}) && c.tallyWrites == 0:
		// With its settlement's source: a reconciler's pass that refunds the charge a peer took
		// from its hold during a pause reads it, and its refund says, as this process's would,
		// whether the call answered nothing (an Idempotency-Key's retry reads that).
		err = s.tally.MarkCallUnused(tctx, c.runID, st.Source)
	case !c.inRun:
		// Its figures set, not added: a try again after a failed one, which may have landed
		// unanswered or land late, counts the call once (tallyPlainCall); numbered, so that
		// an earlier one landing late does not undo it.
		c.tallyWrites++
		err = s.tally.RecordCallWith(tctx, c.runID, c.tallyWrites, st.Usage, st.CostMicro, st.Estimated, s.billedPrices(c, st), nil)
		if err == nil && st.CostMicro == 0 && st.Usage == (pricing.Usage{}) {
			// A call that used nothing after all (an error event after its final one, from a
			// provider that had produced nothing: upstream_error) whose tally an earlier write
			// gave figures (tallyWithFingerprint, at its final event): the zero tally alone
			// (MarkCallUnused) leaves figures it finds, and a reconciler settling the run, its
			// settlement failed too, charged the prompt's estimate for a call settled at 0.
			// Set to nothing above, by a write numbered past the earlier ones (one landing
			// late changes nothing); its source then, as the zero tally's.
			err = s.tally.MarkCallUnused(tctx, c.runID, st.Source)
		}
	default:
		// A named run's one snapshot, its hold's, stands for all its calls: none with the tally.
		err = s.tally.Add(tctx, c.runID, st.Usage, st.CostMicro, st.Estimated)
	}
	if err != nil {
		s.tallyFailed(c, st, err)
		c.tallyMissed = true
		return false
	}
	if c.tallyMissed {
		c.tallyMissed = false
		c.log.Info("run tally written on a later try")
	}
	return true
}

// billedPrices is what a one-call run's tally says of the prices st bills its call at: st's
// snapshot when it is not the one its hold recorded, else nil.
func (s *Server) billedPrices(c *call, st holds.Settlement) []byte {
	if c.inRun || len(st.PriceSnapshot) == 0 || bytes.Equal(st.PriceSnapshot, s.snapshots[c.req.priceKey]) {
		return nil
	}
	return st.PriceSnapshot
}

// tallyWriteTimeout bounds one tally write. A call's own tally goes out after its answer (or
// just before its end), so a Redis that hangs must not hold the call's settlement, or a
// caller's next request, for longer than this.
const tallyWriteTimeout = 2 * time.Second

// tallyFailed counts and logs a tally write that failed. A plain call settles from this
// process's figures, the tally only its fallback. A named run is charged the larger of its
// tally and its row's record, which records every call that ended (recordRunCall), so a lost
// tally write loses nothing while the record lands: the first failure is a warning (not one
// per try: a Redis out of reach for a minute made dozens of lines per call), and only a call
// whose tally never lands and whose record failed too may be missing (runTallyGivenUp).
func (s *Server) tallyFailed(c *call, st holds.Settlement, err error) {
	s.metrics.TallyFailures.Inc()
	switch {
	case !c.inRun && !c.tallyMissed:
		c.log.Warn("tally write failed; tried again beside the settlement until settle_timeout", zap.Error(err))
	case !c.tallyMissed:
		c.log.Warn("run tally write failed; tried again until settle_timeout, the run's row records the call",
			append(callFigures(st), zap.Error(err))...)
	}
}

// runTallyGivenUp logs a named run's call whose tally writes all failed (retryRunCallEnd). Its
// run's row records it unless that write failed too; then the call may be missing from its
// run's charge, and this line, with its figures, is its only record.
func (s *Server) runTallyGivenUp(c *call, st holds.Settlement) {
	if c.recordFailed {
		c.log.Error("run call may be missing from its run's charge: its tally was never written and its row's record failed",
			callFigures(st)...)
		return
	}
	c.log.Warn("run tally never written; the run's row records the call", callFigures(st)...)
}

// callFigures are the log fields of what a call is charged.
func callFigures(st holds.Settlement) []zap.Field {
	return []zap.Field{zap.Int64("cost_micro", st.CostMicro), zap.Int64("in_tok", st.Usage.Input), zap.Int64("out_tok", st.Usage.Output),
		zap.Int64("cache_read_tok", st.Usage.CacheRead), zap.Int64("cache_write_tok", st.Usage.CacheWrite),
		zap.Int64("cache_write_1h_tok", st.Usage.CacheWrite1h), zap.Int64("audio_in_tok", st.Usage.AudioInput),
		zap.Int64("audio_out_tok", st.Usage.AudioOutput), zap.Bool("estimated", st.Estimated)}
}

// retryRunCallEnd writes what the end of a named run's call left unwritten, until all of it has
// landed or settle_timeout has passed, each write safe to repeat: its tally (the run's only
// record of the call in Redis and, for a call that used nothing, the evidence that keeps a run
// nobody comes back to from being charged its hold), then its record on the run's row when
// that failed (recordRunCall), and the drop of its record-to-come mark once the
// record is written. Neither a pause nor the last try outlasts settle_timeout: the drain waits
// for this work within the exit's bound (drain + settle_timeout + 5 s), which a sleep past the
// deadline and a write after it (2 s each) left a second of. The first pause is at most half
// of it, so that a settle_timeout as short as the first pause still gets a try.
func (s *Server) retryRunCallEnd(ctx context.Context, c *call, st holds.Settlement) {
	s.retryUntilSettleTimeout(ctx, func(ctx context.Context) bool {
		if !c.tallied {
			c.tallied = s.tallyCall(ctx, c, st)
		}
		if !c.recorded {
			s.recordRunCall(ctx, c, st)
		}
		if c.recordMarkLeft && s.recordMarkDropped(ctx, c.runID, c.callID) {
			c.recordMarkLeft = false
			recordMarkRetried(c.log, true)
		}
		return c.tallied && c.recorded && !c.recordMarkLeft
	})
	if !c.recorded {
		// Its record-to-come mark, if its tally left one, has lapsed (lease_ttl) or soon does.
		c.recordFailed = true
		if c.tallied {
			c.log.Warn("run call's record on its run's row failed on every try until settle_timeout; unless a try landed unanswered, its tally is its one record",
				callFigures(*c.recordAs)...)
		}
	}
	if !c.tallied {
		s.runTallyGivenUp(c, st)
	}
	if c.recordMarkLeft {
		recordMarkRetried(c.log, false)
	}
}

// retryUntilSettleTimeout calls try, after a pause each time, until it reports true or
// settle_timeout has passed, and reports whether a try landed. try gets the bounded context:
// neither a pause nor a try outlasts settle_timeout (see retryRunCallEnd).
func (s *Server) retryUntilSettleTimeout(ctx context.Context, try func(context.Context) bool) bool {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
	defer cancel()
	for wait := min(tallyRetryFirst, s.cfg.Limits.SettleTimeout/2); ; wait = min(2*wait, tallyRetryMost) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		if try(ctx) {
			return true
		}
	}
}

// tallyRetryFirst and tallyRetryMost are the first and the longest pause between tries of a
// tally write that must land (markRunUnused, retryRunCallEnd): Redis back from a blip is found
// within a tenth of a second, one that is down is not asked more than every two.
const (
	tallyRetryFirst = 100 * time.Millisecond
	tallyRetryMost  = 2 * time.Second
)

// markRunUnused writes a named run's zero tally, retrying for as long as a settlement would
// (the writes are safe to repeat): without it a run nobody comes back to is charged its hold.
func (s *Server) markRunUnused(ctx context.Context, runID string, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
	defer cancel()
	for wait := tallyRetryFirst; ; wait = min(2*wait, tallyRetryMost) {
		err := s.tally.MarkUnused(ctx, runID)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			s.metrics.TallyFailures.Inc()
			log.Error("zero tally of a run with a lost admission not written; it will be charged its hold", zap.Error(err))
			return
		case <-time.After(wait):
		}
	}
}

// dropRecordMark drops the record-to-come mark a failed ReleaseBeforeRecord may have left (it
// ran and its every reply was lost), once the call is recorded on its run's row and its tally
// has landed on a later try: Redis answers again, and the mark, unknown to the call, kept the
// run's settle at 409 run_busy with nothing in flight until it lapsed (the lease TTL).
func (s *Server) dropRecordMark(ctx context.Context, c *call) {
	c.recordMarkUnknown = false
	if err := s.budgets.Recorded(ctx, c.runID, c.callID); err != nil {
		c.log.Warn("run call's record not marked; the run's settlement waits until the mark lapses", zap.Error(err))
	}
}
