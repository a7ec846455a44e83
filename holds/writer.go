package holds

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/token"
)

// Writer commits the admissions and settlements of many concurrent calls in shared batch
// transactions (WriteBatch): one lock per user and one commit then serve many calls.
//
// Batching is opportunistic for admissions: a batch that holds one leaves as soon as a worker
// is free, with whatever else is already waiting, so an admission never waits for company.
// A batch of settlements alone lingers up to Linger for an admission to ride with: settlement is
// off the caller's path, and the user's next call, which would otherwise wait behind the
// settlement's lock and commit, then pays for both with one commit. Under load, batches grow by
// themselves while the workers are busy.
type Writer struct {
	store *Store
	cfg   WriterConfig
	in    chan writeItem
	work  chan []writeItem
	wg    sync.WaitGroup
	// gathered counts items the dispatcher holds that no worker has taken yet.
	gathered atomic.Int64
	// rooms are the room slots of its batches (roomWait).
	rooms roomSlots

	// mu guards sending on in against Close closing it.
	mu     sync.RWMutex
	closed bool
}

// WriterConfig sizes a Writer.
type WriterConfig struct {
	Workers  int // concurrent batch transactions; default 4
	MaxBatch int // items per transaction; default 128, at most MaxBatch
	Queue    int // items waiting for a batch; default 4096
	// AdmitTimeout bounds an admission from its offer to its answer, its wait for a worker
	// and its batch's transaction (retries included) together: a caller waits for it. A batch
	// runs under the earliest deadline of the admissions it carries. SettleTimeout bounds a
	// batch of settlements alone.
	AdmitTimeout  time.Duration
	SettleTimeout time.Duration
	// Linger is how long settlements wait for an admission to share their transaction; 0: none.
	Linger time.Duration
	// OnBatch, when set, is told of every batch transaction after it ends (metrics, tests).
	OnBatch func(BatchShape)
	// ServedBy, when set, names the serving process's instance (Instance.ID) on every new hold
	// this writer admits (AdmitRequest.ServedBy). Read at each admission: a process declared
	// dead and registered again stamps its new id from then on.
	ServedBy func() string
}

// BatchShape is what one batch transaction held, how long it took and how it ended.
type BatchShape struct {
	Settlements, Admissions int
	Err                     error
	// Took is the transaction's time, retries included; AdmitWaits how long each of its
	// admissions waited in the queue for it to start. Together they split an admission's
	// wait into the writer's share and the database's.
	Took       time.Duration
	AdmitWaits []time.Duration
	// Deadline is the one the transaction ran under (its COMMIT, once sent, is waited for
	// past it, up to the driver's read timeout).
	Deadline time.Time
}

// NewWriter starts a writer's dispatcher and workers; Close stops them.
func NewWriter(store *Store, cfg WriterConfig) *Writer {
	defaultSizes(&cfg.Workers, &cfg.MaxBatch, &cfg.Queue)
	if cfg.AdmitTimeout <= 0 || cfg.SettleTimeout <= 0 {
		panic("holds: writer without timeouts")
	}
	if cfg.Linger < 0 || cfg.Linger >= cfg.SettleTimeout {
		panic(fmt.Sprintf("holds: writer linger %v out of [0, settle timeout %v)", cfg.Linger, cfg.SettleTimeout))
	}
	w := &Writer{store: store, cfg: cfg, in: make(chan writeItem, cfg.Queue), work: make(chan []writeItem),
		rooms: make(roomSlots, max(1, cfg.Workers-1))}
	w.wg.Add(1 + cfg.Workers)
	go w.dispatch()
	for range cfg.Workers {
		go w.runWorker()
	}
	return w
}

// Admit takes req's hold in the next batch, within AdmitTimeout of this call or by ctx's
// deadline if that comes first: its deadline. A caller's steps before forwarding share one
// admit_timeout (the proxy's admission budget), so an admission made after others (an
// Idempotency-Key's next attempt) gets what is left of it, not an AdmitTimeout of its own.
// The caller waits for a place in the queue and for a worker to take it until that deadline,
// or until ctx ends, and is then told ErrAdmitNotStarted: nothing was held; so it is when a
// worker finds too little of it left to start (see commit). Once a worker has taken it, it
// waits for the batch whatever ctx says: the batch runs under this admission's deadline (or a
// batch-mate's earlier one), and only its closing script, once sent, is waited for past it, up
// to the driver's read timeout. A caller that left early must still learn of a hold its batch
// committed, so that it releases it rather than leave it to the reconciler, which would charge
// it. The batch used to get AdmitTimeout of its own from when a worker took it, so an
// admission that queued behind a stalled batch waited up to twice AdmitTimeout.
func (w *Writer) Admit(ctx context.Context, req AdmitRequest) (Hold, error) {
	offered := time.Now()
	deadline := offered.Add(w.cfg.AdmitTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	if w.cfg.ServedBy != nil {
		req.ServedBy = w.cfg.ServedBy()
	}
	it := writeItem{admit: &req, taken: new(atomic.Int32), deadline: deadline}
	qctx, cancel := context.WithDeadline(ctx, deadline)
	out, err := w.offer(qctx, it)
	cancel()
	if err != nil {
		return Hold{}, fmt.Errorf("admit %s: %w: %w", req.RunID, ErrAdmitNotStarted, err)
	}
	var o writeOutcome
	select {
	case o = <-out:
	case <-wait.C:
		if it.taken.CompareAndSwap(itemQueued, itemWithdrawn) {
			return Hold{}, fmt.Errorf("admit %s: %w (waited %v)", req.RunID, ErrAdmitNotStarted, time.Since(offered).Round(time.Millisecond))
		}
		o = <-out
	case <-ctx.Done():
		if it.taken.CompareAndSwap(itemQueued, itemWithdrawn) {
			return Hold{}, fmt.Errorf("admit %s: %w: %w", req.RunID, ErrAdmitNotStarted, ctx.Err())
		}
		o = <-out
	}
	if o.err != nil {
		return o.hold, fmt.Errorf("admit %s: %w", req.RunID, o.err)
	}
	return o.hold, nil
}

// Settle settles st in a coming batch and waits for its outcome. A caller that stops waiting
// does not withdraw the settlement: it commits or fails with its batch. So, once a worker has
// taken it, Settle waits for that batch whatever ctx says — the batch runs under its own
// deadline, SettleTimeout or an admission's earlier one, a retry of its settlements alone (or
// of a refused batch's halves) under SettleTimeout more, each COMMIT once sent waited for up to
// the driver's read timeout — and answers what the batch did. It used to answer ctx's error
// there, and a batch that then committed was counted and logged by its caller as a settlement
// that gave up. A settlement still queued when ctx ends is answered ErrSettleQueued at once:
// it has not run, and still runs when a worker is free.
func (w *Writer) Settle(ctx context.Context, st Settlement) (Settled, error) {
	it := writeItem{settle: &st, taken: new(atomic.Int32)}
	out, err := w.offer(ctx, it)
	if err == nil {
		var o writeOutcome
		select {
		case o = <-out:
		case <-ctx.Done():
			if it.taken.Load() == itemQueued {
				return Settled{}, fmt.Errorf("settle %s: %w: %w", st.RunID, ErrSettleQueued, ctx.Err())
			}
			o = <-out
		}
		if o.err == nil {
			return o.settled, nil
		}
		err = o.err
	}
	return Settled{}, fmt.Errorf("settle %s: %w", st.RunID, err)
}

// Close commits what is queued and stops the workers.
func (w *Writer) Close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.in)
	}
	w.mu.Unlock()
	w.wg.Wait()
}

// writeItem is one admission or settlement waiting for its batch.
type writeItem struct {
	admit  *AdmitRequest // one of admit and settle is set
	settle *Settlement
	out    chan writeOutcome
	// taken decides, for an admission, between the worker that starts it (queued -> taken)
	// and the caller that gives up waiting for a worker (queued -> withdrawn). A settlement
	// is never withdrawn: it tells its caller whether a worker has started it (Settle).
	taken *atomic.Int32
	// queued is when the item was offered.
	queued time.Time
	// deadline, for an admission, is when its caller's AdmitTimeout ends: its batch's
	// transaction runs under it.
	deadline time.Time
}

const (
	itemQueued int32 = iota
	itemTaken
	itemWithdrawn
)

// writeOutcome is what an item's caller is answered.
type writeOutcome struct {
	hold    Hold
	settled Settled
	err     error
}

// offer queues it. An item is queued whenever there is room, whatever ctx says; ctx bounds
// only the wait for room in a full queue.
func (w *Writer) offer(ctx context.Context, it writeItem) (chan writeOutcome, error) {
	it.out = make(chan writeOutcome, 1)
	it.queued = time.Now()
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return nil, ErrBatcherClosed
	}
	select {
	case w.in <- it:
		return it.out, nil
	default:
	}
	select {
	case w.in <- it:
		return it.out, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("queue full: %w", ctx.Err())
	}
}

// dispatch forms batches: it gathers items while every worker is busy, and hands the batch
// over when a worker is free and the batch is ready (it holds an admission, is full, has
// lingered long enough, or the writer is closing).
//
// Measured: keeping half the workers from batches of settlements alone, so that admissions
// always find one free, took settle-lag p99 from 47 to 58 ms and the hot user from ~2450 to
// ~2100 req/s; an admission's wait is bounded by its withdrawal instead (see Admit).
func (w *Writer) dispatch() {
	defer w.wg.Done()
	defer close(w.work)
	in := w.in
	var (
		pend     []writeItem
		hasAdmit bool
		lingered bool
		timer    = time.NewTimer(time.Hour)
	)
	timer.Stop()
	for {
		ready := len(pend) > 0 && (hasAdmit || lingered || len(pend) >= w.cfg.MaxBatch || in == nil || w.cfg.Linger == 0)
		if in == nil && len(pend) == 0 {
			return
		}
		var work chan<- []writeItem
		if ready {
			work = w.work
		}
		recv := in
		if len(pend) >= w.cfg.MaxBatch {
			recv = nil // full: wait for a worker
		}
		select {
		case it, ok := <-recv:
			if !ok {
				in = nil
				continue
			}
			if len(pend) == 0 && it.settle != nil && w.cfg.Linger > 0 {
				timer.Reset(w.cfg.Linger)
			}
			pend = append(pend, it)
			w.gathered.Add(1)
			hasAdmit = hasAdmit || it.admit != nil
		case <-timer.C:
			lingered = true
		case work <- pend:
			w.gathered.Add(-int64(len(pend)))
			pend, hasAdmit, lingered = nil, false, false
			timer.Stop()
		}
	}
}

func (w *Writer) runWorker() {
	defer w.wg.Done()
	for batch := range w.work {
		w.commit(batch)
	}
}

// commit runs one batch and answers its items; admissions their callers withdrew are
// dropped unstarted, and so are those with less than a tenth of AdmitTimeout left (answered
// ErrAdmitNotStarted, nothing held): the batch runs under the earliest deadline of the
// admissions it carries, and one with a moment left would fail its batch-mates with it — under
// load, when admissions queue longest, every batch. If a batch with admissions fails as a whole
// (the database stayed unreachable until that deadline), its admissions are answered at once and
// its settlements are tried again alone under their own, longer deadline: an admission's
// deadline must not cut a settlement's, nor a settlement's retries keep a caller waiting.
func (w *Writer) commit(batch []writeItem) {
	start := time.Now()
	minLeft := w.cfg.AdmitTimeout / minAdmitLeftDiv
	deadline := start.Add(w.cfg.SettleTimeout)
	admits := false
	taken := batch[:0:0]
	for _, it := range batch {
		if it.admit == nil {
			it.taken.Store(itemTaken)
			taken = append(taken, it)
			continue
		}
		if left := it.deadline.Sub(start); left < minLeft {
			if it.taken.CompareAndSwap(itemQueued, itemWithdrawn) {
				it.out <- writeOutcome{err: fmt.Errorf("%w (%v of its %v left to start a batch)", ErrAdmitNotStarted, left.Round(time.Millisecond), w.cfg.AdmitTimeout)}
			}
			continue
		}
		if it.taken.CompareAndSwap(itemQueued, itemTaken) {
			if !admits || it.deadline.Before(deadline) {
				deadline = it.deadline
			}
			admits = true
			taken = append(taken, it)
		}
	}
	if len(taken) > 0 {
		w.run(taken, start, deadline, time.Time{})
	}
}

// run runs one batch of taken items under deadline (the earliest of its admissions', or
// SettleTimeout from when a worker took it for settlements alone) and answers its items.
// settleBy, for a part of a refused batch, is when its settlements' time ends, the retry of
// them alone included; zero for a whole batch, whose retry gets SettleTimeout of its own.
//
// A batch the database refused for what one of its statements holds (isItemRefusal: a value
// out of range, a duplicate key, a string too long; or a panic while building it) committed
// nothing, and is most likely refused for one item's sake: it is split in halves, run one
// after the other in batch order (a settlement still commits before the admissions that
// followed it), down to the item at fault, which alone is answered the refusal. Without it
// one such item failed every admission and settlement that happened to share its batch: the
// admissions answered 503, the settlements left to the reconciler. A refusal that is every
// item's (a schema out of date) costs at most 2n-1 transactions for a batch of n before each
// is answered it.
func (w *Writer) run(batch []writeItem, start, deadline, settleBy time.Time) {
	var sts []Settlement
	var reqs []AdmitRequest
	var waits []time.Duration
	for i, it := range batch {
		if it.admit != nil && w.cfg.OnBatch != nil {
			waits = append(waits, start.Sub(it.queued))
		}
		if it.settle != nil {
			// Drawn once for every batch that may carry it (a half after a refusal, the retry
			// of the settlements alone): the retry after a batch whose COMMIT reply was lost
			// must recognise what that batch committed.
			if it.settle.token == "" {
				st := *it.settle
				st.token = token.New()
				batch[i].settle = &st
			}
			sts = append(sts, *batch[i].settle)
		} else {
			reqs = append(reqs, *it.admit)
		}
	}
	ctx, cancel := context.WithDeadline(w.withRooms(context.Background()), deadline)
	settled, admitted, err := w.writeBatch(ctx, sts, reqs)
	cancel()
	w.observe(BatchShape{Settlements: len(sts), Admissions: len(reqs), Err: err, Took: time.Since(start), AdmitWaits: waits, Deadline: deadline})
	if len(batch) > 1 && isItemRefusal(err) {
		w.store.log.Warn("batch refused; trying its halves apart", zap.Int("settlements", len(sts)), zap.Int("admissions", len(reqs)),
			zap.Strings("run_ids", batchRuns(sts, reqs)), zap.Error(err))
		if settleBy.IsZero() {
			// Every part's settlements, tried again alone too, are done within one
			// SettleTimeout: a database that goes out of reach meanwhile holds the worker
			// that long, not that long for each part.
			settleBy = time.Now().Add(w.cfg.SettleTimeout)
		}
		half := len(batch) / 2
		for _, part := range [][]writeItem{batch[:half], batch[half:]} {
			if part = w.dropLate(part, time.Now()); len(part) > 0 {
				w.run(part, time.Now(), partDeadline(part, settleBy), settleBy)
			}
		}
		return
	}
	if err != nil && len(batch) == 1 && isItemRefusal(err) {
		w.store.log.Error("item refused by the database", zap.String("run_id", batchRuns(sts, reqs)[0]),
			zap.Bool("settlement", len(sts) == 1), zap.Error(err))
	}
	answerAdmissions(batch, admitted, err)
	if err != nil && len(sts) > 0 && len(reqs) > 0 {
		// The first batch's settlement writes may have committed unanswered (ErrOutcomeUnknown):
		// a retry that fails too never found out, and its own error must not tell the callers
		// that nothing was charged.
		mayHaveSettled := errors.Is(err, ErrOutcomeUnknown)
		retryBy := settleBy
		if retryBy.IsZero() {
			retryBy = time.Now().Add(w.cfg.SettleTimeout)
		}
		ctx, cancel = context.WithDeadline(w.withRooms(context.Background()), retryBy)
		again := time.Now()
		settled, _, err = w.writeBatch(ctx, sts, nil)
		cancel()
		w.observe(BatchShape{Settlements: len(sts), Err: err, Took: time.Since(again)})
		if err != nil && mayHaveSettled && !errors.Is(err, ErrOutcomeUnknown) {
			err = fmt.Errorf("settlements: %w: %w", ErrOutcomeUnknown, err)
		}
	}
	answerSettlements(batch, settled, err)
}

// dropLate answers the admissions of part of a refused batch that have less than a tenth of
// AdmitTimeout left (ErrAdmitNotStarted: the refused batch committed nothing, and they are not
// started again), as commit does for a whole batch, and returns the rest of part: one with a
// moment left would fail its part's other items with it.
func (w *Writer) dropLate(part []writeItem, now time.Time) []writeItem {
	minLeft := w.cfg.AdmitTimeout / minAdmitLeftDiv
	kept := part[:0:0]
	for _, it := range part {
		if left := it.deadline.Sub(now); it.admit != nil && left < minLeft {
			it.out <- writeOutcome{err: fmt.Errorf("%w (%v of its %v left after its batch was refused)", ErrAdmitNotStarted, left.Round(time.Millisecond), w.cfg.AdmitTimeout)}
			continue
		}
		kept = append(kept, it)
	}
	return kept
}

// partDeadline is the deadline of part of a refused batch: the earliest of its admissions',
// or settle, the batch's settlements' own, when it carries none.
func partDeadline(part []writeItem, settle time.Time) time.Time {
	deadline, admits := settle, false
	for _, it := range part {
		if it.admit != nil && (!admits || it.deadline.Before(deadline)) {
			deadline, admits = it.deadline, true
		}
	}
	return deadline
}

// writeBatch is Store.WriteBatch that turns a panic while building or running the batch into
// its error (errBatchPanicked), an item refusal: a worker that panicked took the whole process
// down, every call in flight with it, for what is most likely one item's fault. The panic
// unwinds the batch's deferred rollback and connection release before it is recovered here;
// nothing recovered can have committed (the SettledHook, told after the COMMIT, is outside).
func (w *Writer) writeBatch(ctx context.Context, sts []Settlement, reqs []AdmitRequest) ([]BatchResult, []AdmitResult, error) {
	settled, admitted, err := w.tryBatch(ctx, sts, reqs)
	if err == nil {
		w.store.tellSettled(sts, settled)
	}
	return settled, admitted, err
}

// tryBatch runs Store.writeBatch, recovering its panic (see writeBatch).
func (w *Writer) tryBatch(ctx context.Context, sts []Settlement, reqs []AdmitRequest) (settled []BatchResult, admitted []AdmitResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			w.store.log.Error("panic in a batch", zap.Any("panic", p), zap.Strings("run_ids", batchRuns(sts, reqs)), zap.Stack("stack"))
			settled, admitted, err = nil, nil, fmt.Errorf("%s: %w: %v", batchName(sts, reqs), errBatchPanicked, p)
		}
	}()
	return w.store.writeBatch(ctx, sts, reqs)
}

// minAdmitLeftDiv: an admission with less than AdmitTimeout/minAdmitLeftDiv left when a worker
// takes its batch is not started (see commit).
const minAdmitLeftDiv = 10

// roomSlots bounds how many of a Writer's batches wait for room on a full disk at once
// (outOfRoomError): one fewer than its workers, at least one. A batch waits up to
// settle_timeout, holding its worker; were every worker so held, the writer would take
// nothing else meanwhile — neither a named run's later call, which changes its row in place
// and goes on while its page has room, nor a settlement that fits where it is. A batch refused
// so when every slot is taken fails at once, as every such batch did before: its holds are
// left to the reconciler.
type roomSlots chan struct{}

type roomSlotsKey struct{}

// withRooms gives ctx the writer's room slots, for its batches.
func (w *Writer) withRooms(ctx context.Context) context.Context {
	return context.WithValue(ctx, roomSlotsKey{}, w.rooms)
}

// roomWait is a batch's claim to wait for room on a full disk.
type roomWait struct {
	slots roomSlots // the slot taken, if one was; nil: none, or no writer's
	held  bool
}

// take claims the wait for the batch whose ctx it is, at its first refusal for want of room,
// and reports whether it holds it: always for a batch of no writer's (a store's caller waits
// alone, as it would for a database out of reach), else if one of its writer's room slots is
// free.
func (r *roomWait) take(ctx context.Context) bool {
	if r.held {
		return true
	}
	slots, ok := ctx.Value(roomSlotsKey{}).(roomSlots)
	if !ok {
		r.held = true
		return true
	}
	select {
	case slots <- struct{}{}:
		r.slots, r.held = slots, true
		return true
	default:
		return false
	}
}

// release gives back the slot the batch took, if it took one.
func (r *roomWait) release() {
	if r.slots != nil {
		<-r.slots
		r.slots = nil
	}
}

func (w *Writer) observe(b BatchShape) {
	if w.cfg.OnBatch != nil {
		w.cfg.OnBatch(b)
	}
}

// answerAdmissions hands the batch's admissions their outcomes; err fails them all.
func answerAdmissions(batch []writeItem, admitted []AdmitResult, err error) {
	i := 0
	for _, it := range batch {
		if it.admit == nil {
			continue
		}
		o := writeOutcome{err: err}
		var unknown *OutcomeUnknownError
		switch {
		case err == nil:
			o.hold, o.err = admitted[i].Hold, admitted[i].Err
		case errors.As(err, &unknown):
			o.err = unknown.forRun(it.admit.RunID)
		}
		i++
		it.out <- o
	}
}

// answerSettlements hands the batch's settlements their outcomes; err fails them all.
func answerSettlements(batch []writeItem, settled []BatchResult, err error) {
	i := 0
	for _, it := range batch {
		if it.settle == nil {
			continue
		}
		o := writeOutcome{err: err}
		if err == nil {
			o.settled, o.err = settled[i].Settled, settled[i].Err
		}
		i++
		it.out <- o
	}
}
