package holds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/pricing"
)

// The reconciler settles what a dead process left behind (DESIGN §5). It never decides on
// its own whether a run is alive: a lease in Redis says a live process still serves it, the
// tally in Redis says what it used, and the store's conditional update makes the first
// settlement — the reconciler's or a slow process's — the only one that charges.
//
// A one-call run it charged its hold (no lease, no tally: reconcile_hold) whose call was alive
// after all (its process stopped, not killed) has its tally written after the charge; a later
// pass reads it and gives back by grant what the call did not use, once per run whoever sends
// it (refundPaused): the settled run's charge itself never changes.
//
// holds does not import metering: the three Redis facts arrive through the small interfaces
// below, which cmd wires over runstate.Tally, runstate.Leases and the lock key.

// UsageSource reads a run's tally: what its calls used, as written after each call.
type UsageSource interface {
	// Tallied returns the run's tally; found is false when the run has none at all. A tally
	// that was read but is no record of usage (garbage in its fields) is an error wrapping
	// ErrTallyCorrupt.
	Tallied(ctx context.Context, runID string) (t RunTally, found bool, err error)
}

// ErrTallyCorrupt is a run's tally that was read but is no record of usage: the reconciler
// settles the run as one without a tally, as it does one whose figures are impossible
// (TallyBelievable). Any other error of Tallied is a failed read, tried again at the next pass.
var ErrTallyCorrupt = errors.New("tally is no record of usage")

// RunTally is what a run's calls used by its tally: summed usage, cost at list price, calls.
type RunTally struct {
	Usage     pricing.Usage
	CostMicro int64
	Calls     int64
	// Estimated says a call was charged the gateway's estimate (no usage report): the run
	// settled from the tally is marked so, as the call's own settlement would have marked it.
	Estimated bool
	// PriceSnapshot, when set, is the snapshot of the prices the run's call was billed at,
	// which are not those its hold recorded at admission (another model answered): the
	// settlement records it in their place.
	PriceSnapshot []byte
	// Age is how long ago the tally was last written: by the write's time a one-call run's
	// tally holds (Redis's clock), or, for a tally without one (an older gateway's), by its TTL
	// run down (every write gives it holds.tally_ttl). The revisit of a run charged its hold
	// waits for a tally that stands still (RefundAfter); 0, as a source that does not tell
	// gives it, is a tally just written.
	Age time.Duration
	// Source is the settlement source of a one-call run's call that used nothing, as its zero
	// tally says (release, duplicate, upstream_error, admit_lost), "" when it does not: the
	// revisit's refund says by it whether the call answered nothing (tallyRefundReason).
	Source string
}

// TallyBelievable reports whether a run's tally can be a record of what it used. The tally is
// Redis's word, not the ledger's: a negative figure in it (a correction whose tally was lost, a
// hand edit) is none, and the store refuses a negative cost by panicking; nor is a call count
// past the column that records it (no run makes 2³¹ calls), whose settlement fails. Every
// token count is checked, the parts (one-hour cache writes, audio) too: a negative part was
// recorded on the run's row as it stood.
func TallyBelievable(u pricing.Usage, cost, calls int64) bool {
	return cost >= 0 && calls >= 0 && calls <= math.MaxInt32 && !u.HasNegative()
}

// RefusalSource tells whether an admission, by its run and token, was refused after its
// COMMIT went unanswered (the gateway's mark, written before its 503): the hold carrying that
// token, committed after all, was never forwarded. Marks that were read but are no record
// (garbage) are an error wrapping ErrTallyCorrupt: the hold is charged as one without a mark.
type RefusalSource interface {
	Refused(ctx context.Context, runID, token string) (bool, error)
}

// LeaseChecker tells whether some live process still serves a run.
type LeaseChecker interface {
	Exists(ctx context.Context, runID string) (bool, error)
}

// Locker elects the one process that scans in a period (billing:reconcile:lock, DESIGN §5).
// The lock is left to expire rather than released: its holder keeps it by asking again within
// its TTL, and a killed holder blocks the others only until it lapses.
type Locker interface {
	TryLock(ctx context.Context) (bool, error)
}

// Outcomes of one expired hold, as reported to OnOutcome and counted in Stats.
const (
	OutcomeExtended       = "extended"        // a lease was present: expiry pushed out, not settled
	OutcomeFromTally      = "reconcile"       // settled from the tally
	OutcomeReleased       = "release"         // queued, no tally: released at 0
	OutcomeChargedHeld    = "reconcile_hold"  // running, no tally: charged held_micro
	OutcomeAlreadySettled = "already_settled" // someone settled it between the scan and our update
	OutcomeError          = "error"           // left for the next pass
)

// Explicit limits of one pass.
const (
	// DefaultReconcileBatch is the rows read per query (DESIGN §5).
	DefaultReconcileBatch = 200
	// DefaultReconcileMaxBatches bounds one pass, so a backlog of expired holds after a long
	// outage is worked off over several periods instead of one pass that never ends and
	// outlives its lock by far.
	DefaultReconcileMaxBatches = 50
	// DefaultReconcilePassBudget bounds one pass in time as MaxBatches does in count: no hold
	// is started after it, so with the item timeout below a pass ends within 50 s, the life of
	// the reconcile lock (DESIGN §5), and a second process does not scan beside it. The
	// sessions' prune after the scan, and the revisit of the runs charged their hold after
	// that, are cut at that end too (pruneSessions, refundPaused).
	DefaultReconcilePassBudget = 20 * time.Second
	// reconcileItemTimeout bounds the work on one hold (Redis reads plus one settlement with its
	// retries); a hold that takes longer is left for the next pass.
	reconcileItemTimeout = 30 * time.Second
	// reconcileLockTimeout bounds the request for the reconcile lock (one Redis round trip):
	// past it the pass is skipped and the next tick asks again. Unbounded, a request Redis never
	// answered (a client without a read timeout of its own) stopped the reconciler for good.
	reconcileLockTimeout = 5 * time.Second
)

// ReconcilerConfig wires a Reconciler.
type ReconcilerConfig struct {
	Store  *Store
	Usage  UsageSource
	Leases LeaseChecker
	// Refusals, when set, is asked about a running hold with no lease and no tally before it
	// is charged what it held: one its own admission's request marked refused is released at
	// 0 (SourceAdmitLost). A pass's revisit asks it too of a run charged its hold with no
	// tally (refundPaused): one marked since is refunded whole. Nil: never asked.
	Refusals RefusalSource
	Lock     Locker
	Log      *zap.Logger
	Interval time.Duration // between passes; DESIGN default 60 s
	// ExtendBy is how far a hold whose run is still leased is pushed out: one hold TTL.
	// ExtendRunBy is the same for a named run (one run TTL, what its admission gave it);
	// 0: ExtendBy.
	ExtendBy, ExtendRunBy time.Duration
	// Batch is the rows read per query (0: DefaultReconcileBatch); MaxBatches bounds one pass
	// (0: DefaultReconcileMaxBatches).
	Batch, MaxBatches int
	// PassBudget is how long a pass may go on starting holds (0: DefaultReconcilePassBudget);
	// the first hold of a pass is always handled, so every pass makes progress.
	PassBudget time.Duration
	// PriceSnapshot, when set, gives the price snapshot stored with a settlement from the
	// tally, by the model recorded at admission, for a hold that recorded no prices when it was
	// admitted (one that did keeps its own); nil or an empty result stores none.
	PriceSnapshot func(model string) []byte
	// OnOutcome, when set, is called once per expired hold handled (for metrics).
	OnOutcome func(outcome string)
	// DeadAfter, when positive, is how long an instance's heartbeat (Instance) may be silent
	// before a pass declares it dead — or the instance's own bound, when longer — and brings
	// in the expiry of the unleased one-call holds it admitted, which the same pass then
	// reconciles (sweepDead). Zero: no sweep; holds wait for their expiry whatever their
	// process.
	DeadAfter time.Duration
	// Self is this process's Instance: a pass declares others dead only once Self has beaten
	// without a gap for DeadAfter (Instance.BeatingFor), its last beat is fresh by the
	// database clock, and it has watched their beat stand still for longer than their gap.
	// Nil (an operator's one-off pass): no instance is declared dead, though those declared
	// before, or retired, are still swept.
	Self *Instance
	// OnDeadInstances, when set, is told how many instances a pass declared dead (for
	// metrics); retired ones are not counted.
	OnDeadInstances func(n int)
	// OnPass, when set, is told of each pass this process ran holding the lock, and whether it
	// failed (for metrics: a fleet whose passes stopped leaves every expired hold unsettled,
	// silently).
	OnPass func(failed bool)
	// RefundWindow, when positive, is how far back a pass revisits the one-call runs it
	// charged their hold (reconcile_hold) to give back what their call's tally (or their
	// admission's refusal's mark), written after the charge, says the call did not use
	// (refundPaused): holds.tally_ttl, the life of the tally and of the mark.
	// Zero: never revisited; the call's process alone refunds.
	RefundWindow time.Duration
	// RefundAfter is how long a call's tally must have stood unwritten (RunTally.Age) before
	// the revisit refunds on it: holds.lease_ttl. A younger one may still hold the final
	// event's figures, set right beside the settlement by a process resumed from a pause that
	// has not beaten its lease again yet — within a lease TTL, if it lives. Zero: no wait.
	RefundAfter time.Duration
}

// Reconciler settles expired holds. Every process runs one; the lock makes only one scan per
// period, and the conditional settlement makes a second scanner harmless anyway.
type Reconciler struct {
	cfg ReconcilerConfig

	// resume is where the next pass's scan starts: where a pass stopped at its batch limit or
	// time budget left off, so that a backlog of holds no pass can settle (orphans, see scan)
	// larger than one pass does not take every pass's whole budget, leaving the holds behind
	// it unsettled for good. The zero value (a pass that reached the end) starts at the oldest.
	mu     sync.Mutex
	resume expiredCursor
	// deadResume is where the next pass reads the dead instance rows from (sweepDead), and
	// holdsResume where it reads on in the holds of each row a pass stopped inside: the last
	// run id read, by dead instance id (sweepOne). At most maxDeadPerPass entries.
	deadResume  deadCursor
	holdsResume map[string]string
	// heldResume is where the next pass's revisit of the runs charged their hold goes on
	// (refundPaused).
	heldResume heldCursor
	// itemTimeout is reconcileItemTimeout; tests shorten it to see a pass's end without
	// waiting for it.
	itemTimeout time.Duration
}

// NewReconciler checks the wiring and applies defaults. It panics on a wiring error, which is
// a programming mistake, not a runtime condition.
func NewReconciler(cfg ReconcilerConfig) *Reconciler {
	if cfg.Store == nil || cfg.Usage == nil || cfg.Leases == nil || cfg.Lock == nil || cfg.Log == nil {
		panic("holds: reconciler needs a store, a usage source, a lease checker, a lock and a logger")
	}
	if cfg.ExtendBy <= 0 {
		panic("holds: reconciler without an extension TTL")
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultReconcileBatch
	}
	if cfg.MaxBatches == 0 {
		cfg.MaxBatches = DefaultReconcileMaxBatches
	}
	if cfg.PassBudget == 0 {
		cfg.PassBudget = DefaultReconcilePassBudget
	}
	if cfg.Batch < 1 || cfg.Batch > maxListRows || cfg.MaxBatches < 1 || cfg.PassBudget < 0 {
		panic(fmt.Sprintf("holds: reconciler batch %d x %d out of range", cfg.Batch, cfg.MaxBatches))
	}
	return &Reconciler{cfg: cfg, itemTimeout: reconcileItemTimeout}
}

// Stats is what one pass did.
type Stats struct {
	Locked         bool // this process held the lock and scanned (always true for a forced pass)
	Batches        int
	Scanned        int
	Extended       int
	FromTally      int
	Released       int
	ChargedHeld    int
	AlreadySettled int
	Errors         int
	// Orphans is the holds passed over because their user's row is gone (deleted by hand):
	// no pass can settle them until the user is restored, so they are counted apart from
	// Errors, which the next pass retries.
	Orphans int
	// PrunedSessions is the sessions rows deleted: their run had settled and they were idle.
	PrunedSessions int
	// PauseRefunds is the runs charged their hold whose call's tally, written after, said it
	// used less, and that this pass refunded the difference of (refundPaused).
	PauseRefunds int
	// DeadInstances is the instances this pass declared dead; BroughtIn the holds of dead
	// instances whose expiry it brought in (and then scanned with the expired ones).
	DeadInstances, BroughtIn int
	ChargedMicro             int64 // total charged by this pass
	// Truncated: the pass stopped at MaxBatches with a full last batch, or at PassBudget;
	// more may remain. StoppedAt says which, for the operator told to run again (empty when
	// the pass was not truncated).
	Truncated bool
	StoppedAt PassBound
}

// Settled is the number of holds this pass closed.
func (st Stats) Settled() int { return st.FromTally + st.Released + st.ChargedHeld }

// PassBound is the bound that stopped a truncated pass.
type PassBound string

const (
	StopBatchLimit PassBound = "batch limit" // MaxBatches full batches read
	StopTimeBudget PassBound = "time budget" // PassBudget spent before the next hold
)

// Run reconciles every Interval until ctx ends. It passes once at start, so a process that
// comes up after a crash starts cleaning up at once rather than a period later.
func (r *Reconciler) Run(ctx context.Context) {
	if r.cfg.Interval <= 0 {
		panic("holds: reconciler without an interval")
	}
	tick := time.NewTicker(r.cfg.Interval)
	defer tick.Stop()
	for {
		st, err := r.RunOnce(ctx)
		if st.Locked && r.cfg.OnPass != nil && ctx.Err() == nil {
			r.cfg.OnPass(err != nil)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			r.cfg.Log.Error("reconcile pass failed", zap.Error(err), zap.Int("settled", st.Settled()),
				zap.Int("errors", st.Errors))
		case st.Scanned > 0 || st.PrunedSessions > 0 || st.DeadInstances > 0 || st.PauseRefunds > 0:
			r.cfg.Log.Info("reconcile pass", statsFields(st)...)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// RunOnce takes the lock and, if this process won it, settles expired holds.
func (r *Reconciler) RunOnce(ctx context.Context) (Stats, error) {
	// The pass's bounds count from the lock's request, not its reply: the lock's life began
	// when Redis took it, and a reply that came late ate into it.
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, reconcileLockTimeout)
	ok, err := r.cfg.Lock.TryLock(lctx)
	cancel()
	if err != nil {
		return Stats{}, fmt.Errorf("reconcile: take lock: %w", err)
	}
	if !ok {
		return Stats{}, nil
	}
	return r.pass(ctx, start)
}

// RunForced scans without the lock, for an operator who knows the lock holder is stuck. It is
// safe beside a running scanner: every settlement is conditional and an extension only moves
// a live hold's expiry.
func (r *Reconciler) RunForced(ctx context.Context) (Stats, error) { return r.pass(ctx, time.Now()) }

// SessionPruneIdle is how long a session whose run has settled keeps its row after its last
// claim: the pause between two messages of one conversation, generously.
const SessionPruneIdle = 10 * time.Minute

// pass brings in the holds of dead instances (DeadAfter), settles expired holds, prunes
// sessions that have ended, then revisits the one-call runs charged their hold whose call's
// tally came after the charge (RefundWindow, refundPaused). A sweep, a prune or a revisit that
// fails is logged and tried again on the next pass: what the sweep left waits a pass longer, a
// refund left waits as long (its tally lives tally_ttl), what the prune left costs room.
//
// The whole pass runs under one deadline, start + PassBudget + the item timeout, the bound the
// reconcile lock's life is sized by: each hold's work had its own timeout, but the reads
// between them (the expired holds', a dead instance's) ran on ctx alone, and one stalled (a
// table locked by a long ALTER or a backup) kept the pass going past its lock, a second
// process scanning beside it.
func (r *Reconciler) pass(ctx context.Context, start time.Time) (Stats, error) {
	end := start.Add(r.cfg.PassBudget + r.itemTimeout)
	ctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var declared, brought int
	if r.cfg.DeadAfter > 0 {
		var derr error
		// A quarter of the pass's budget, taken from the scan's: the pass still ends within the
		// budget and one hold's work, inside the reconcile lock.
		declared, brought, derr = r.sweepDead(ctx, start.Add(r.cfg.PassBudget/4))
		if derr != nil && ctx.Err() == nil {
			// What was brought in is scanned below; the rest waits for the next pass.
			r.cfg.Log.Warn("reconcile: holds of dead instances not all brought in; the next pass goes on", zap.Error(derr))
		}
	}
	st, err := r.scan(ctx, start)
	st.DeadInstances, st.BroughtIn = declared, brought
	if ctx.Err() == nil {
		st.PrunedSessions = r.pruneSessions(ctx, start.Add(r.cfg.PassBudget), end)
	}
	// Last: its backlog can wait as long as a tally lives, and after a fleet killed mid-call
	// it reads every dead call's run at every pass (a lease and a tally each) until stopAt.
	if r.cfg.RefundWindow > 0 && ctx.Err() == nil {
		st.PauseRefunds = r.refundPaused(ctx, start.Add(r.cfg.PassBudget), end)
	}
	return st, err
}

// pruneSessions deletes sessions idle past SessionPruneIdle whose run has ended, a batch at a
// time while batches come back full and stopAt is ahead, and at least one batch however the
// scan went if the pass has time left before end: passes alone prune sessions, so a pass that
// skipped it whenever its scan was cut short (a backlog of expired holds) or failed (one hold
// that cannot be settled, every pass) let the table grow for as long as that lasted. Bounded by
// the pass's time budget, as the scan is, not by MaxBatches: one that stopped at MaxBatches
// batches let the table grow by the rest at every pass wherever more conversations ended
// between two passes. Each batch ends by end, the pass's own: a scan whose last hold took its
// whole item timeout (a database refusing writes, a batch retried until its deadline) left the
// prune's first batch another item timeout of retries, and the pass outlived the reconcile
// lock, so a second process scanned beside it.
func (r *Reconciler) pruneSessions(ctx context.Context, stopAt, end time.Time) (pruned int) {
	for {
		left := time.Until(end)
		if left <= 0 {
			r.cfg.Log.Warn("reconcile: no time left in the pass to prune ended sessions; the next pass tries again")
			return pruned
		}
		pctx, cancel := context.WithTimeout(ctx, min(r.itemTimeout, left))
		n, err := r.cfg.Store.PruneSessions(pctx, SessionPruneIdle, r.cfg.Batch)
		cancel()
		pruned += int(n)
		if err != nil {
			r.cfg.Log.Warn("reconcile: ended sessions not pruned; the next pass tries again", zap.Error(err))
			return pruned
		}
		if n < int64(r.cfg.Batch) || !time.Now().Before(stopAt) {
			return pruned
		}
	}
}

// scan settles expired holds, starting none after start + PassBudget.
//
// A hold that fails is passed over, as an orphan is, and the pass says it failed: a scan that
// stopped at the end of any batch with a failure never read past its first batch for as long as
// one old hold kept failing (its tally on a Redis Cluster shard that is down, say), and every
// expired hold behind it stayed live, its credits held. A batch in which every hold failed
// looks like an outage rather than a bad hold (the database or Redis unreachable would fail the
// rest too): the scan stops there, and the next pass goes on after it, so that even a full
// batch of holds that keep failing holds nobody else's up for longer than a pass.
func (r *Reconciler) scan(ctx context.Context, start time.Time) (Stats, error) {
	s := passScan{st: Stats{Locked: true}, stopAt: start.Add(r.cfg.PassBudget)}
	// The scan goes on after the last hold it read, so holds it cannot settle (orphans, holds
	// that fail) are passed over rather than heading every batch: a backlog of them would
	// otherwise stop every pass at its first batch, and nobody else's hold behind them would
	// ever settle.
	r.mu.Lock()
	s.after = r.resume
	r.mu.Unlock()
	for s.st.Batches < r.cfg.MaxBatches {
		runs, err := r.cfg.Store.expired(ctx, s.after, r.cfg.Batch)
		if err != nil {
			return s.st, errors.Join(fmt.Errorf("reconcile: %w", err), s.failed())
		}
		s.st.Batches++
		failedBefore := len(s.errs)
		if stopped, err := r.scanBatch(ctx, &s, runs); stopped || err != nil {
			return s.st, errors.Join(err, s.failed())
		}
		if len(runs) > 0 && len(s.errs)-failedBefore == len(runs) {
			r.cfg.Log.Warn("reconcile: every hold of a batch failed; the next pass goes on after it",
				zap.Int("batch", len(runs)))
			r.resumeAt(s.after)
			return s.st, s.failed()
		}
		if len(runs) < r.cfg.Batch {
			r.resumeAt(expiredCursor{})
			return s.st, s.failed()
		}
	}
	s.st.Truncated, s.st.StoppedAt = true, StopBatchLimit
	r.cfg.Log.Warn("reconcile pass stopped at its batch limit; the rest waits for the next pass",
		zap.Int("batches", s.st.Batches), zap.Int("batch", r.cfg.Batch))
	r.resumeAt(s.after)
	return s.st, s.failed()
}

// passScan is one scan's progress, carried from batch to batch.
type passScan struct {
	st     Stats
	stopAt time.Time     // no hold is started after it: the pass's time budget
	after  expiredCursor // the last hold read, where the next batch goes on from
	errs   []error       // the holds that failed, each left for a later pass
}

// failed is the scan's error for the holds that failed, or nil when none did.
func (s *passScan) failed() error {
	if len(s.errs) == 0 {
		return nil
	}
	return fmt.Errorf("reconcile: %d of %d holds failed: %w", len(s.errs), s.st.Scanned, errors.Join(s.errs[:min(len(s.errs), 3)]...))
}

// scanBatch handles one batch of expired holds, in order; the holds that fail are added to
// s.errs. stopped says the scan ends here: ctx ended (err says so), or the time budget was spent
// (then the next pass resumes after the last hold read).
func (r *Reconciler) scanBatch(ctx context.Context, s *passScan, runs []Run) (stopped bool, err error) {
	for _, run := range runs {
		if ctx.Err() != nil {
			return true, fmt.Errorf("reconcile: %w", ctx.Err())
		}
		if s.st.Scanned > 0 && time.Now().After(s.stopAt) {
			s.st.Truncated, s.st.StoppedAt = true, StopTimeBudget
			r.cfg.Log.Warn("reconcile pass stopped at its time budget; the rest waits for the next pass",
				zap.Int("scanned", s.st.Scanned), zap.Duration("budget", r.cfg.PassBudget))
			// The holds that failed stay behind the cursor, as orphans do, until a pass gets
			// through the backlog and starts again from the oldest; the pass says they failed.
			r.resumeAt(s.after)
			return true, nil
		}
		s.st.Scanned++
		s.after = run.cursor()
		outcome, charged, err := r.one(ctx, run)
		switch {
		case errors.Is(err, errUserGone):
			// Nothing can be charged to nobody; no retry will change that.
			if s.st.Orphans++; s.st.Orphans <= 10 {
				r.cfg.Log.Error("reconcile: hold of a user that no longer exists left unsettled — someone should look",
					zap.String("run_id", run.RunID), zap.Uint64("user_id", run.UserID), zap.Error(err))
			}
		case errors.Is(err, ErrRunNotFound):
			// The hold the scan read is gone, or another admission's holds its run id now
			// (deleted by hand; pruned and its Idempotency-Key run id admitted again): nothing
			// of the scanned one is left to settle, and the new hold is reconciled on its own.
			// Counted as an orphan, it failed `gateway reconcile -once` with "restore the users".
			r.cfg.Log.Info("reconcile: hold gone or replaced since the scan read it; nothing to settle",
				zap.String("run_id", run.RunID), zap.Uint64("user_id", run.UserID), zap.Error(err))
		case err != nil:
			if s.errs = append(s.errs, err); len(s.errs) <= 10 {
				r.cfg.Log.Warn("reconcile: hold left for the next pass", zap.String("run_id", run.RunID), zap.Uint64("user_id", run.UserID), zap.Error(err))
			}
			s.st.count(outcome, charged)
		default:
			s.st.count(outcome, charged)
		}
		if r.cfg.OnOutcome != nil {
			r.cfg.OnOutcome(outcome)
		}
	}
	return false, nil
}

// resumeAt is where the next pass's scan starts. A pass that stopped at a limit, or at a batch
// in which every hold failed, leaves the next one its cursor; a pass that drained the backlog
// has the next start again from the oldest; one that ctx ended leaves it as it found it.
func (r *Reconciler) resumeAt(c expiredCursor) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resume = c
}

func (st *Stats) count(outcome string, charged int64) {
	st.ChargedMicro += charged
	switch outcome {
	case OutcomeExtended:
		st.Extended++
	case OutcomeFromTally:
		st.FromTally++
	case OutcomeReleased:
		st.Released++
	case OutcomeChargedHeld:
		st.ChargedHeld++
	case OutcomeAlreadySettled:
		st.AlreadySettled++
	default:
		st.Errors++
	}
}

// one applies DESIGN §5 to one expired hold and returns what it did and what it charged.
func (r *Reconciler) one(ctx context.Context, run Run) (string, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.itemTimeout)
	defer cancel()
	log := r.cfg.Log.Named(MoneyLog).With(zap.String("run_id", run.RunID), zap.Uint64("user_id", run.UserID),
		zap.String("state", string(run.State)))

	// 1. A live process still serves the run (a stream longer than its TTL, say): leave it.
	leased, err := r.cfg.Leases.Exists(ctx, run.RunID)
	if err != nil {
		return OutcomeError, 0, fmt.Errorf("reconcile %s: %w", run.RunID, err)
	}
	if leased {
		return r.extend(ctx, run, log)
	}
	usage, found, err := r.used(ctx, run, log)
	if err != nil {
		// Without the tally we cannot tell "used nothing" from "unreadable": charging the hold
		// on a Redis blip would overcharge, so the hold waits for the next pass.
		return OutcomeError, 0, fmt.Errorf("reconcile %s: %w", run.RunID, err)
	}
	refused, err := r.refused(ctx, run, found)
	if errors.Is(err, ErrTallyCorrupt) {
		// Asking again reads the same garbage: the hold failed every pass for as long as the
		// key lived.
		log.Error("reconcile: the run's marks of refused admissions are no record; charging it as a run without one — someone should look",
			zap.Error(err))
		refused, err = false, nil
	}
	if err != nil {
		// Unreadable: charging the hold on a Redis blip could charge a refused call.
		return OutcomeError, 0, fmt.Errorf("reconcile %s: %w", run.RunID, err)
	}
	st, outcome := r.settlement(run, usage, found, refused)
	return r.settle(ctx, run, st, outcome, log)
}

// extend pushes out the expiry of a hold whose run a live process still serves: one hold TTL,
// or one run TTL for a named run, what its admission gave it.
func (r *Reconciler) extend(ctx context.Context, run Run, log *zap.Logger) (string, int64, error) {
	by := r.cfg.ExtendBy
	if run.ClientRunID.Valid && r.cfg.ExtendRunBy > 0 {
		by = r.cfg.ExtendRunBy
	}
	if _, err := r.cfg.Store.Extend(ctx, run.RunID, by); err != nil {
		return OutcomeError, 0, fmt.Errorf("reconcile %s: %w", run.RunID, err)
	}
	log.Debug("reconcile: run still leased; expiry extended", zap.Duration("by", by))
	return OutcomeExtended, 0, nil
}

// used is what run used, by the evidence the reconciler trusts: its tally, or its row's record
// of its ended calls when that says more; found is false when neither says anything that can be
// believed. The Estimated mark is the tally's, whichever figures won.
func (r *Reconciler) used(ctx context.Context, run Run, log *zap.Logger) (tally RunTally, found bool, err error) {
	tally, found, err = r.cfg.Usage.Tallied(ctx, run.RunID)
	if errors.Is(err, ErrTallyCorrupt) {
		// Read as "unreadable", the hold waited for a next pass that read the same garbage,
		// every pass failing, for as long as the key lived.
		log.Error("reconcile: the run's tally is no record of usage; settling it as a run without one — someone should look",
			zap.Error(err))
		tally, found, err = RunTally{}, false, nil
	}
	if err != nil {
		return tally, found, err
	}
	// A tally TallyBelievable refuses would panic the store in this goroutine, the whole
	// process, on every pass, or fail its settlement on every pass. Such a run's usage is lost:
	// settled as one without a tally.
	usage, cost, calls := tally.Usage, tally.CostMicro, tally.Calls
	if found && !TallyBelievable(usage, cost, calls) {
		log.Error("reconcile: the run's tally holds impossible figures; settling it as a run without one — someone should look",
			zap.Int64("cost_micro", cost), zap.Int64("calls", calls), zap.Int64("in_tok", usage.Input),
			zap.Int64("out_tok", usage.Output), zap.Int64("cache_read_tok", usage.CacheRead), zap.Int64("cache_write_tok", usage.CacheWrite),
			zap.Int64("cache_write_1h_tok", usage.CacheWrite1h), zap.Int64("audio_in_tok", usage.AudioInput),
			zap.Int64("audio_out_tok", usage.AudioOutput))
		tally.Usage, tally.CostMicro, tally.Calls, found = pricing.Usage{}, 0, 0, false
	}
	if len(tally.PriceSnapshot) > 0 && !json.Valid(tally.PriceSnapshot) {
		// The row's JSON column refuses it: its settlement would fail on every pass until the
		// tally lapsed, and the run would then be charged what it held. Its figures stand; the
		// row keeps the prices its hold recorded.
		log.Error("reconcile: the run's tally carries prices that are no JSON; settling it at the hold's — someone should look",
			zap.Int("snapshot_bytes", len(tally.PriceSnapshot)))
		tally.PriceSnapshot = nil
	}
	// A named run's row records its ended calls too: a tally that lost some of them (a Redis
	// restart) costs less than the row, and the row is what the run used. A row whose record
	// cannot be one is none (Recorded): no code path writes a negative figure there, but a hand
	// edit or a restored backup can, and a negative cost taken from it panicked the store on
	// every pass.
	if !run.RecordBelievable() {
		ru := run.Usage()
		log.Error("reconcile: the run's row records impossible figures of its calls; not settling from them — someone should look",
			zap.Int64("row_cost_micro", run.CostMicro), zap.Int("row_calls", run.Calls), zap.Int64("row_in_tok", ru.Input),
			zap.Int64("row_out_tok", ru.Output), zap.Int64("row_cache_read_tok", ru.CacheRead),
			zap.Int64("row_cache_write_tok", ru.CacheWrite), zap.Int64("row_cache_write_1h_tok", ru.CacheWrite1h),
			zap.Int64("row_audio_in_tok", ru.AudioInput), zap.Int64("row_audio_out_tok", ru.AudioOutput))
	}
	if ru, rc, rn, rfound := run.Recorded(); rfound && (!found || RecordsMore(rc, rn, tally.CostMicro, tally.Calls)) {
		tally.Usage, tally.CostMicro, tally.Calls, tally.PriceSnapshot, found = ru, rc, rn, nil, true
	}
	return tally, found, nil
}

// settlement is the settlement of an expired, unleased hold, by what its run used (found
// false: nothing known) and whether its admission was refused, with the outcome it stands for.
func (r *Reconciler) settlement(run Run, used RunTally, found, refused bool) (Settlement, string) {
	st := Settlement{RunID: run.RunID, OnlyIfExpired: true}
	switch {
	case found:
		// 2. Settled from the tally: Settle applies the hold's discount and clamps to its cap.
		st.Usage, st.CostMicro, st.Calls, st.Source = used.Usage, used.CostMicro, int(used.Calls), SourceReconcile
		// A named run's row keeps its calls' marks through the settlement; a one-call run's
		// mark is in the tally alone.
		st.Estimated = used.Estimated
		if len(used.PriceSnapshot) > 0 {
			// The call was billed at other prices than its hold's (another model answered it):
			// with the hold's, its tokens would not give its cost.
			st.PriceSnapshot = used.PriceSnapshot
		} else if r.cfg.PriceSnapshot != nil {
			// The tally's cost was computed at the prices the hold recorded when it was
			// admitted, which may predate this process's table: ours only stands in for none.
			st.PriceSnapshot, st.SnapshotIfMissing = r.cfg.PriceSnapshot(run.Model), true
		}
		return st, OutcomeFromTally
	case run.State == StateQueued:
		// 3a. Never forwarded: nothing was used.
		st.Source = SourceRelease
		return st, OutcomeReleased
	case refused:
		// 3a too: the request that inserted this hold (its token) was refused 503 without
		// forwarding, its release lost with its process. Only that request forwards on a hold
		// that is not a named run's (another request of an Idempotency-Key attempt gets it
		// back as existing and is answered 409), so nothing used it. The release it would have
		// made: at 0, only the hold carrying its token.
		st.Source, st.AdmitToken = SourceAdmitLost, run.AdmitToken.String
		return st, OutcomeReleased
	default:
		// 3b. A call was forwarded and its usage is lost: charge what the caller authorised.
		st.Source, st.ChargeHeld, st.Estimated = SourceReconcileHold, true, true
		return st, OutcomeChargedHeld
	}
}

// settle applies st, the settlement that stands for outcome, and logs what it charged: only
// the first settlement of a run charges, and a run a call kept alive since the scan is left.
func (r *Reconciler) settle(ctx context.Context, run Run, st Settlement, outcome string, log *zap.Logger) (string, int64, error) {
	res, err := r.cfg.Store.Settle(ctx, st)
	if errors.Is(err, ErrRunStillLive) {
		log.Info("reconcile: a call of the run pushed its expiry out since the scan; not settled")
		return OutcomeExtended, 0, nil
	}
	if err != nil {
		return OutcomeError, 0, fmt.Errorf("reconcile %s: %w", run.RunID, err)
	}
	if !res.Applied {
		log.Info("reconcile: run was settled by someone else first")
		return OutcomeAlreadySettled, 0, nil
	}
	fields := []zap.Field{zap.String("source", st.Source), zap.Int64("charged_micro", res.ChargedMicro),
		zap.Int64("cost_micro", res.CostMicro), zap.Int("calls", st.Calls), zap.Time("expired_at", run.ExpiresAt)}
	if outcome == OutcomeChargedHeld {
		log.Error("reconcile: run settled at its hold; its usage was lost — someone should look", fields...)
	} else {
		log.Info("reconcile: run settled", fields...)
	}
	return outcome, res.ChargedMicro, nil
}

// refused reports whether run, a running hold with no lease and no tally (tallied false), was
// inserted by an admission its request marked refused. Asked of nothing else: a tally settles
// a run whatever the marks say, a queued hold is released anyway, and a named run's hold
// carries other calls (its lost admissions are not marked).
func (r *Reconciler) refused(ctx context.Context, run Run, tallied bool) (bool, error) {
	if r.cfg.Refusals == nil || tallied || run.State != StateRunning || run.ClientRunID.Valid ||
		!run.AdmitToken.Valid || run.AdmitToken.String == "" {
		return false, nil
	}
	return r.cfg.Refusals.Refused(ctx, run.RunID, run.AdmitToken.String)
}

func statsFields(st Stats) []zap.Field {
	f := []zap.Field{zap.Int("batches", st.Batches), zap.Int("scanned", st.Scanned), zap.Int("extended", st.Extended),
		zap.Int("from_tally", st.FromTally), zap.Int("released", st.Released), zap.Int("charged_held", st.ChargedHeld),
		zap.Int("already_settled", st.AlreadySettled), zap.Int("errors", st.Errors), zap.Int("pruned_sessions", st.PrunedSessions),
		zap.Int("pause_refunds", st.PauseRefunds),
		zap.Int64("charged_micro", st.ChargedMicro), zap.Bool("truncated", st.Truncated),
		zap.Int("dead_instances", st.DeadInstances), zap.Int("brought_in", st.BroughtIn)}
	if st.Truncated {
		f = append(f, zap.String("stopped_at", string(st.StoppedAt)))
	}
	return f
}
