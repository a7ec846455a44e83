package proxy

import (
	"context"
	"errors"
	"testing"
	"time"
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
	// The first unit leaves once that wait is under way (it has made the idle channel): a
	// leave that ended it with a unit still in must be seen.
	// The channel the wait is blocked on: it returns nil exactly when this is closed (its
	// context never ends), so whether the leave ended it is read here, at once, rather than
	// hoped from how soon the goroutine would have returned.
	var waitsOn chan struct{}
	waitingSince := time.Now()
	for {
		f.mu.Lock()
		waitsOn = f.idle
		f.mu.Unlock()
		if waitsOn != nil {
			break
		}
		if time.Since(waitingSince) > 10*time.Second {
			t.Fatal("the wait never began")
		}
		time.Sleep(time.Millisecond)
	}
	f.leave()
	select {
	case <-waitsOn:
		t.Fatal("the first of two units to leave ended the wait: it returns with one unit still in")
	default:
	}
	ended, end := context.WithCancel(context.Background())
	end()
	if err := f.wait(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with one unit still in and its context ended: %v, want context.Canceled", err)
	}
	select {
	case err := <-done:
		t.Fatalf("wait returned (%v) with one unit still in", err)
	default:
	}
	f.leave()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait after the last unit left: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait begun with two units in did not return once the last one left")
	}
	// Bounded, so that a wait that never returns with nothing in fails here rather than hangs.
	idle, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := f.wait(idle); err != nil {
		t.Fatalf("wait with nothing in: %v", err)
	}
}

// TestInFlightWaitsAgainForWorkAfterItWasIdle: the count can fall to zero and rise again
// before close (a settlement ends, the next call enters): a wait begun after that waits for the
// work now in, not for the idle spell that already ended. (The first spell's idle channel,
// kept once closed, answered every later wait at once: Drain reported nothing in flight with a
// call running.)
func TestInFlightWaitsAgainForWorkAfterItWasIdle(t *testing.T) {
	var f inFlight
	f.enter()
	// A wait that its context ends makes the idle channel that the unit's leave closes.
	ended, end := context.WithCancel(context.Background())
	end()
	if err := f.wait(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a unit in and its context ended: %v, want context.Canceled", err)
	}
	f.leave()
	if err := f.wait(context.Background()); err != nil {
		t.Fatalf("wait with nothing in: %v", err)
	}
	f.enter()
	// The context still runs when wait begins: only the unit's leaving, or the context's end,
	// may end this wait.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with a unit in after an idle spell: %v, want context.DeadlineExceeded", err)
	}
	f.leave()
	if err := f.wait(context.Background()); err != nil {
		t.Fatalf("wait with nothing in: %v", err)
	}
}

// TestInFlightMisuseIsLoud: a leave without its enter, or a settlement started on a closed
// counter, is a bug that would lose a settlement silently (the count gone negative lets Drain
// return under running work; a settlement not counted is not waited for): each panics.
func TestInFlightMisuseIsLoud(t *testing.T) {
	for _, tc := range []struct {
		name   string
		misuse func(f *inFlight)
	}{
		{"leave without enter", func(f *inFlight) { f.leave() }},
		{"second leave after one enter", func(f *inFlight) { f.enter(); f.leave(); f.leave() }},
		{"start after close", func(f *inFlight) { f.close(); f.start() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f inFlight
			defer func() {
				if recover() == nil {
					t.Fatalf("%s did not panic", tc.name)
				}
			}()
			tc.misuse(&f)
		})
	}
}
