package holds

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Settler groups the settlements of many concurrent calls into SettleBatch transactions.
// Batching is opportunistic: a worker takes the first waiting settlement and whatever else is
// already queued, up to MaxBatch, and never waits for more. Under light load every batch is
// one settlement and nothing is delayed; under heavy load batches grow by themselves and one
// commit serves many calls.
type Settler struct {
	store    *Store
	in       chan settleRequest
	maxBatch int
	timeout  time.Duration
	wg       sync.WaitGroup

	// mu guards sending on in against Close closing it.
	mu     sync.RWMutex
	closed bool
}

// SettlerConfig sizes a Settler.
type SettlerConfig struct {
	Workers  int           // concurrent batch transactions; default 4
	MaxBatch int           // settlements per transaction; default 128, at most MaxBatch
	Queue    int           // settlements waiting for a worker; default 4096
	Timeout  time.Duration // one batch, retries included
}

type settleRequest struct {
	st  Settlement
	out chan BatchResult
}

// NewSettler starts the workers; Close stops them.
func NewSettler(store *Store, cfg SettlerConfig) *Settler {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.MaxBatch <= 0 || cfg.MaxBatch > MaxBatch {
		cfg.MaxBatch = min(128, MaxBatch)
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 4096
	}
	if cfg.Timeout <= 0 {
		panic("holds: settler without a timeout")
	}
	b := &Settler{store: store, in: make(chan settleRequest, cfg.Queue), maxBatch: cfg.MaxBatch, timeout: cfg.Timeout}
	for i := 0; i < cfg.Workers; i++ {
		b.wg.Add(1)
		go b.work()
	}
	return b
}

// ErrSettlerClosed is returned to settlements offered after Close.
var ErrSettlerClosed = errors.New("settler closed")

// Settle settles st in the next batch and waits for its outcome or ctx. A caller that stops
// waiting does not withdraw the settlement: it commits or fails with its batch.
func (b *Settler) Settle(ctx context.Context, st Settlement) (Settled, error) {
	req := settleRequest{st: st, out: make(chan BatchResult, 1)}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return Settled{}, fmt.Errorf("settle %s: %w", st.RunID, ErrSettlerClosed)
	}
	select {
	case b.in <- req:
		b.mu.RUnlock()
	case <-ctx.Done():
		b.mu.RUnlock()
		return Settled{}, fmt.Errorf("settle %s: queue full: %w", st.RunID, ctx.Err())
	}
	select {
	case r := <-req.out:
		if r.Err != nil {
			return Settled{}, fmt.Errorf("settle %s: %w", st.RunID, r.Err)
		}
		return r.Settled, nil
	case <-ctx.Done():
		return Settled{}, fmt.Errorf("settle %s: %w", st.RunID, ctx.Err())
	}
}

// Close stops taking settlements, finishes the queued ones, and waits for the workers.
func (b *Settler) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.in)
	}
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *Settler) work() {
	defer b.wg.Done()
	batch := make([]settleRequest, 0, b.maxBatch)
	sts := make([]Settlement, 0, b.maxBatch)
	for first := range b.in {
		batch = append(batch[:0], first)
	fill:
		for len(batch) < b.maxBatch {
			select {
			case r, ok := <-b.in:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		sts = sts[:0]
		for _, r := range batch {
			sts = append(sts, r.st)
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		res, err := b.store.SettleBatch(ctx, sts)
		cancel()
		for i, r := range batch {
			if err != nil {
				r.out <- BatchResult{Err: err}
			} else {
				r.out <- res[i]
			}
		}
	}
}
