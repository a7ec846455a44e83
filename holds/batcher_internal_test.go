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
