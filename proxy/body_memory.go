package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// bodyMemory bounds the request bodies a process holds at once, and each caller's share of
// them (limits.max_body_memory, max_body_memory_per_caller). A body counts from the moment its
// request is read until its call is over: it is parsed, rewritten and forwarded from memory,
// and the parsed request refers into it. Without the bound a caller with any valid key, even one
// without credits, could open connections until their bodies (max_body_bytes each) exhausted
// the host's memory; the process killed by that would leave every call in flight to the
// reconciler, charged at its hold where its usage was lost.
//
// A body is counted whole from its Content-Length before any of it is read (a chunked one as it
// is read), and never waited for: a reader that waited for room while holding part of a body
// could wait on others that wait on it. So a body that does not fit is refused at once, its
// caller told to retry (503 server_busy, or 429 when it is the caller's own share that is
// full), and nothing is held for it: the bound is checked before admission.
type bodyMemory struct {
	limit, perCaller int64
	held             prometheus.Gauge

	mu       sync.Mutex
	total    int64
	byCaller map[uint64]int64
}

// Why a body did not fit; readBody answers each with its own error.
var (
	errBodyMemoryFull   = errors.New("request bodies in memory at the process's limit")
	errCallerBodyMemory = errors.New("request bodies in memory at the caller's limit")
)

// bodyRetryAfter is what a caller refused for room is told to wait: bodies leave memory as
// calls end, which is seconds for most.
const bodyRetryAfter = time.Second

func newBodyMemory(limit, perCaller int64, held prometheus.Gauge) *bodyMemory {
	if limit <= 0 || perCaller <= 0 || perCaller > limit {
		panic(fmt.Sprintf("proxy: body memory %d, per caller %d", limit, perCaller))
	}
	return &bodyMemory{limit: limit, perCaller: perCaller, held: held, byCaller: map[uint64]int64{}}
}

// lease starts counting one request's body for caller; its release, deferred by the handler,
// gives back what it counted.
func (m *bodyMemory) lease(caller uint64) *bodyLease { return &bodyLease{m: m, caller: caller} }

// take counts n more bytes of caller's bodies, or none and says which bound they would pass.
// Nothing is no entry: give, which removes a caller's entry as it gives back its last byte,
// gives nothing back without looking, and an entry of 0 would stay for the process's life.
func (m *bodyMemory) take(caller uint64, n int64) error {
	if n == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	mine := m.byCaller[caller]
	switch {
	case mine+n > m.perCaller:
		return errCallerBodyMemory
	case m.total+n > m.limit:
		return errBodyMemoryFull
	}
	m.byCaller[caller] = mine + n
	m.total += n
	m.held.Add(float64(n))
	return nil
}

// give hands back n bytes of caller's bodies.
func (m *bodyMemory) give(caller uint64, n int64) {
	if n == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	mine := m.byCaller[caller] - n
	if mine < 0 || m.total < n {
		panic(fmt.Sprintf("proxy: body memory gives back %d of caller %d holding %d (all %d)", n, caller, mine+n, m.total))
	}
	if mine == 0 {
		delete(m.byCaller, caller) // the map holds the callers reading or served now, no more
	} else {
		m.byCaller[caller] = mine
	}
	m.total -= n
	m.held.Sub(float64(n))
}

// bodyLease is what one request's body has counted.
type bodyLease struct {
	m      *bodyMemory
	caller uint64
	n      int64
}

// reserve counts n bytes of the body before they are read (its Content-Length).
func (l *bodyLease) reserve(n int64) error {
	if err := l.m.take(l.caller, n); err != nil {
		return err
	}
	l.n += n
	return nil
}

// reader counts what r reads beyond what the lease has counted already, and fails a read that
// does not fit.
func (l *bodyLease) reader(r io.Reader) io.Reader { return &countedBody{r: r, lease: l} }

// release gives back everything the lease counted; safe to call more than once.
func (l *bodyLease) release() {
	l.m.give(l.caller, l.n)
	l.n = 0
}

type countedBody struct {
	r     io.Reader
	lease *bodyLease
	read  int64
}

func (c *countedBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += int64(n)
	if over := c.read - c.lease.n; over > 0 {
		if terr := c.lease.reserve(over); terr != nil {
			return 0, terr
		}
	}
	return n, err
}

// bodyMemoryError is the answer to a body refused for room, or nil for any other error.
func bodyMemoryError(err error) *apiError {
	switch {
	case errors.Is(err, errCallerBodyMemory):
		return &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "too_many_request_bytes",
			Message:    "Your requests in flight on this gateway hold as many body bytes as one caller may; retry when some have ended.",
			RetryAfter: bodyRetryAfter}
	case errors.Is(err, errBodyMemoryFull):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "server_busy",
			Message: "The gateway holds as many request bodies as it may; retry shortly.", RetryAfter: bodyRetryAfter}
	}
	return nil
}
