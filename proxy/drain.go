package proxy

import (
	"context"
	"sync"
)

// inFlight counts work in flight (calls, settlements) so that shutdown can wait for it, and,
// once closed, lets no more in.
//
// sync.WaitGroup does not fit: at shutdown a call can still arrive while the wait has begun
// (a connection that had read its request before the listener closed), and a WaitGroup's Add
// from zero beside its Wait is a misuse it may panic on; even when it does not, the call runs
// with nobody waiting for its settlement. Here such a call is refused before it holds anything.
type inFlight struct {
	mu     sync.Mutex
	n      int
	closed bool
	// idle is closed when n drops to zero; nil while nobody waits.
	idle chan struct{}
}

// enter counts one more unit of work in, unless close was called: then it returns false and
// the work must not start.
func (f *inFlight) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.n++
	return true
}

// start counts in work that must run whatever happens, a settlement: its counter is never
// closed, and a closed one here is a bug that would lose money silently.
func (f *inFlight) start() {
	if !f.enter() {
		panic("proxy: a settlement started after its counter was closed")
	}
}

// leave counts one unit of work out; each enter that returned true is followed by one leave.
func (f *inFlight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n <= 0 {
		panic("proxy: inFlight.leave without enter")
	}
	f.n--
	if f.n == 0 && f.idle != nil {
		close(f.idle)
		f.idle = nil
	}
}

// close lets no more work in; what is in goes on.
func (f *inFlight) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
}

// isClosed reports whether close was called: work that is not counted in (a token count, which
// holds nothing for the drain to wait for) is refused by it as counted work is by enter.
func (f *inFlight) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// wait returns when no work is in, or with ctx's error when ctx ends first. Before close, work
// entering while it waits is waited for too, as long as the count has not reached zero.
func (f *inFlight) wait(ctx context.Context) error {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return nil
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
