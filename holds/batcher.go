package holds

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// BatcherConfig sizes a KeyLookup.
type BatcherConfig struct {
	Workers  int           // concurrent batches; default 4
	MaxBatch int           // requests per batch; default 128, at most MaxBatch
	Queue    int           // requests waiting for a worker; default 4096
	Timeout  time.Duration // one batch, retries included
}

// KeyLookup groups API key lookups into UsersByKeys queries. Batching is opportunistic: a
// worker takes the first waiting lookup and whatever else is already queued, and never waits
// for more.
type KeyLookup struct{ b *batcher[string, KeyResult] }

// NewKeyLookup starts a key lookup's workers; Close stops them.
func NewKeyLookup(store *Store, cfg BatcherConfig) *KeyLookup {
	return &KeyLookup{b: newBatcher(cfg, store.UsersByKeys)}
}

// User authenticates key: ErrBadKey for an unknown or revoked key or a disabled user.
func (k *KeyLookup) User(ctx context.Context, key string) (User, error) {
	r, err := k.b.do(ctx, key)
	if err == nil {
		err = r.Err
	}
	if err != nil {
		return User{}, err
	}
	return r.User, nil
}

// Close stops the workers.
func (k *KeyLookup) Close() { k.b.close() }

// batcher runs requests of type T in batches through run, which returns one R per request.
type batcher[T, R any] struct {
	run      func(context.Context, []T) ([]R, error)
	in       chan batchItem[T, R]
	maxBatch int
	timeout  time.Duration
	wg       sync.WaitGroup

	// mu guards sending on in against close closing it.
	mu     sync.RWMutex
	closed bool
}

type batchItem[T, R any] struct {
	ctx context.Context // the caller's: one that has ended is not looked up
	req T
	out chan batchOutcome[R]
}

type batchOutcome[R any] struct {
	res R
	err error
}

// defaultSizes fills in a batcher's or writer's sizes left zero (or, for maxBatch, out of
// range): 4 workers, batches of at most 128, 4096 waiting.
func defaultSizes(workers, maxBatch, queue *int) {
	if *workers <= 0 {
		*workers = 4
	}
	if *maxBatch <= 0 || *maxBatch > MaxBatch {
		*maxBatch = min(128, MaxBatch)
	}
	if *queue <= 0 {
		*queue = 4096
	}
}

func newBatcher[T, R any](cfg BatcherConfig, run func(context.Context, []T) ([]R, error)) *batcher[T, R] {
	defaultSizes(&cfg.Workers, &cfg.MaxBatch, &cfg.Queue)
	if cfg.Timeout <= 0 {
		panic("holds: batcher without a timeout")
	}
	b := &batcher[T, R]{run: run, in: make(chan batchItem[T, R], cfg.Queue), maxBatch: cfg.MaxBatch, timeout: cfg.Timeout}
	for i := 0; i < cfg.Workers; i++ {
		b.wg.Add(1)
		go b.work()
	}
	return b
}

// do queues req and waits for its outcome; ctx bounds both waits. A caller whose ctx ends is
// told so while its request may still run (the outcome is lost to it). A ctx that had ended
// before the call is told so, not "queue full": with room in the queue, select would pick
// either case.
func (b *batcher[T, R]) do(ctx context.Context, req T) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	item := batchItem[T, R]{ctx: ctx, req: req, out: make(chan batchOutcome[R], 1)}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return zero, ErrBatcherClosed
	}
	select {
	case b.in <- item:
		b.mu.RUnlock()
	case <-ctx.Done():
		b.mu.RUnlock()
		return zero, fmt.Errorf("queue full: %w", ctx.Err())
	}
	select {
	case o := <-item.out:
		return o.res, o.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func (b *batcher[T, R]) close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.in)
	}
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *batcher[T, R]) work() {
	defer b.wg.Done()
	batch := make([]batchItem[T, R], 0, b.maxBatch)
	reqs := make([]T, 0, b.maxBatch)
	for first := range b.in {
		batch = b.take(batch[:0], first)
	fill:
		for len(batch) < b.maxBatch {
			select {
			case it, ok := <-b.in:
				if !ok {
					break fill
				}
				batch = b.take(batch, it)
			default:
				break fill
			}
		}
		if len(batch) == 0 {
			continue
		}
		reqs = reqs[:0]
		for _, it := range batch {
			reqs = append(reqs, it.req)
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		res, err := b.run(ctx, reqs)
		cancel()
		for i, it := range batch {
			if err != nil {
				it.out <- batchOutcome[R]{err: err}
			} else {
				it.out <- batchOutcome[R]{res: res[i]}
			}
		}
	}
}

// take adds it to batch unless its caller has gone: while the database is slow, callers give
// up on lookups still queued, and a worker that ran them anyway spent its batches on answers no
// one reads, while the lookups of callers still waiting queued behind them and timed out in
// turn — one slow spell made every uncached key fail until the queue emptied.
func (b *batcher[T, R]) take(batch []batchItem[T, R], it batchItem[T, R]) []batchItem[T, R] {
	if err := it.ctx.Err(); err != nil {
		it.out <- batchOutcome[R]{err: err}
		return batch
	}
	return append(batch, it)
}
