package proxy

import (
	"context"
	"errors"
	"testing"
)

// TestInFlightWaitsForWhatItLetInAndRefusesTheRest: close lets nothing more in, and wait
// returns exactly when the last unit let in has left.
func TestInFlightWaitsForWhatItLetInAndRefusesTheRest(t *testing.T) {
	var f inFlight
	for range 2 {
		if !f.enter() {
			t.Fatal("enter refused before close")
		}
	}
	f.close()
	if f.enter() {
		t.Fatal("enter let in after close")
	}
	done := make(chan error, 1)
	go func() { done <- f.wait(context.Background()) }()
	f.leave()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with one unit still in and its context ended: %v, want context.Canceled", err)
	}
	select {
	case err := <-done:
		t.Fatalf("wait returned (%v) with one unit still in", err)
	default:
	}
	f.leave()
	if err := <-done; err != nil {
		t.Fatalf("wait after the last unit left: %v", err)
	}
	if err := f.wait(context.Background()); err != nil {
		t.Fatalf("wait with nothing in: %v", err)
	}
}
