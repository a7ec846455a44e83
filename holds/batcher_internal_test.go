package holds

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestBatcherSkipsLookupsWhoseCallersLeft: while the database is slow, callers give up on key
// lookups still queued. Run anyway, those lookups took the workers' batches from the callers
// still waiting behind them, who then timed out too. A worker now answers a lookup whose
// caller has gone with its caller's error, and runs only the ones still waited for.
func TestBatcherSkipsLookupsWhoseCallersLeft(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var ran [][]string
	b := newBatcher(BatcherConfig{Workers: 1, MaxBatch: 128, Queue: 128, Timeout: time.Minute},
		func(_ context.Context, reqs []string) ([]string, error) {
			mu.Lock()
			ran = append(ran, slices.Clone(reqs))
			first := len(ran) == 1
			mu.Unlock()
			if first {
				close(started)
				<-release
			}
			return reqs, nil
		})
	defer b.close()

	ctx := context.Background()
	firstDone := make(chan error, 1)
	go func() { _, err := b.do(ctx, "slow"); firstDone <- err }()
	<-started // the one worker is inside the slow batch

	gone, leave := context.WithCancel(ctx)
	var left sync.WaitGroup
	for i := range 50 {
		left.Add(1)
		go func() {
			defer left.Done()
			if _, err := b.do(gone, fmt.Sprintf("gone-%d", i)); !errors.Is(err, context.Canceled) {
				t.Errorf("a lookup whose caller left: %v, want context.Canceled", err)
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(b.in) < 50 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 50 lookups queued", len(b.in))
		}
		time.Sleep(time.Millisecond)
	}
	leave()
	left.Wait()

	waiting := make(chan error, 1)
	go func() {
		res, err := b.do(ctx, "waiting")
		if err == nil && res != "waiting" {
			err = fmt.Errorf("answered %q", res)
		}
		waiting <- err
	}()
	for len(b.in) < 51 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 51 lookups queued", len(b.in))
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatalf("the slow lookup: %v", err)
	}
	if err := <-waiting; err != nil {
		t.Fatalf("the lookup still waited for: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, batch := range ran[1:] {
		for _, req := range batch {
			if req != "waiting" {
				t.Fatalf("batches run after the slow one: %v; want only the lookup still waited for", ran[1:])
			}
		}
	}
}

// TestBatcherBatchesNoMoreThanMaxBatch: a worker that finds more lookups queued than a batch
// holds takes MaxBatch of them and leaves the rest to the next batch (a store's batch query is
// sized for MaxBatch); a MaxBatch past the store's bound is the default; and each batch runs
// under the batcher's Timeout, not without a deadline.
func TestBatcherBatchesNoMoreThanMaxBatch(t *testing.T) {
	if b := newBatcher(BatcherConfig{MaxBatch: MaxBatch + 1, Timeout: time.Minute},
		func(_ context.Context, reqs []int) ([]int, error) { return reqs, nil }); b.maxBatch != min(128, MaxBatch) {
		b.close()
		t.Fatalf("a MaxBatch of %d became %d, want the default %d", MaxBatch+1, b.maxBatch, min(128, MaxBatch))
	} else {
		b.close()
	}

	const maxBatch, timeout = 2, time.Minute
	started, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	var noDeadline int
	b := newBatcher(BatcherConfig{Workers: 1, MaxBatch: maxBatch, Queue: 16, Timeout: timeout},
		func(ctx context.Context, reqs []int) ([]int, error) {
			d, ok := ctx.Deadline()
			mu.Lock()
			sizes = append(sizes, len(reqs))
			first := len(sizes) == 1
			if !ok || time.Until(d) > timeout {
				noDeadline++
			}
			mu.Unlock()
			if first {
				close(started)
				<-release
			}
			return reqs, nil
		})
	defer b.close()
	ctx := context.Background()
	errs := make(chan error, 6)
	lookup := func(req int) {
		res, err := b.do(ctx, req)
		if err == nil && res != req {
			err = fmt.Errorf("lookup %d answered %d", req, res)
		}
		errs <- err
	}
	go lookup(0)
	<-started // the one worker is inside the first batch
	for i := 1; i <= 5; i++ {
		go lookup(i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(b.in) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 5 lookups queued", len(b.in))
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	for range 6 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, n := range sizes {
		if n > maxBatch {
			t.Fatalf("batch sizes %v, want none over MaxBatch %d", sizes, maxBatch)
		}
	}
	if noDeadline > 0 {
		t.Fatalf("%d of %d batches ran without the batcher's %v deadline", noDeadline, len(sizes), timeout)
	}
}

// TestBatcherTellsAnEndedCallerSo: a lookup whose context had ended before the call is
// answered its context's error, not "queue full" though the queue has room (select would
// pick either case).
func TestBatcherTellsAnEndedCallerSo(t *testing.T) {
	b := newBatcher(BatcherConfig{Workers: 1, Timeout: time.Minute},
		func(_ context.Context, reqs []int) ([]int, error) { return reqs, nil })
	defer b.close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 64 {
		if _, err := b.do(ctx, i); err != context.Canceled {
			t.Fatalf("lookup %d with its context ended: %v, want context.Canceled as such", i, err)
		}
	}
}
