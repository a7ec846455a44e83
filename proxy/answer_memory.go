package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
)

// answerMemory bounds the non-streamed answers a process holds at once
// (limits.max_response_memory). Such an answer is read whole before it is relayed — so that
// one cut short, or no answer at all, is refused rather than half sent, and it is metered
// before it goes out — up to max_response_bytes each. Without the bound, callers asking for
// large answers at once (embeddings of long lists, images, speech) could exhaust the host's
// memory, and the process killed by that would leave every call in flight to the reconciler,
// charged at its hold where its usage was lost.
//
// Unlike a request body, which is refused at once when it does not fit, an answer waits for
// room: the provider has made it and bills it, and its caller is charged it whether or not it
// is passed on. An answer whose length is known counts it whole before any of it is read, so
// while it waits it holds nothing another answer waits for; one of unknown length counts its
// buffer as it grows, and could wait on another doing the same. So an answer's waits are
// bounded, all of them together (answerMemoryWait), first come first served, after which the
// answer is not passed on: 503 server_busy, charged what it used (answerMemoryFull). An answer
// whose Content-Length passes max_response_bytes is never read whole, and waits for nothing.
type answerMemory struct {
	sem   *semaphore.Weighted
	wait  time.Duration // answerMemoryWait; shorter in tests
	held  prometheus.Gauge
	waits prometheus.Counter
}

// answerMemoryWait bounds one wait for room. Answers leave memory as fast as their callers
// read them; one still waiting after this is most likely in a deadlock of growing buffers.
const answerMemoryWait = 5 * time.Second

// errAnswerMemoryFull is an answer that found no room within answerMemoryWait.
var errAnswerMemoryFull = errors.New("whole answers in memory at the process's limit")

// firstAnswerBuffer is the first buffer of an answer of unknown length (io.ReadAll's own):
// most answers are a few KiB.
const firstAnswerBuffer = 512

func newAnswerMemory(limit int64, held prometheus.Gauge, waits prometheus.Counter) *answerMemory {
	if limit <= 0 {
		panic(fmt.Sprintf("proxy: answer memory %d", limit))
	}
	return &answerMemory{sem: semaphore.NewWeighted(limit), wait: answerMemoryWait, held: held, waits: waits}
}

// buffer starts counting one answer; its release, deferred by the caller, gives back what it
// counted.
func (m *answerMemory) buffer() *answerBuffer { return &answerBuffer{m: m} }

// answerBuffer is what one answer has counted.
type answerBuffer struct {
	m *answerMemory
	n int64
	// waitUntil ends the answer's waits for room, all of them: set by its first (one whose
	// buffer grows waits at each step otherwise, 16 steps to 32 MiB).
	waitUntil time.Time
}

// readAll reads r to its end, at most limit+1 bytes (one past limit tells an answer too large
// to relay), into a buffer counted before it is allocated: sized by sizeHint (the answer's
// Content-Length, -1 when unknown) when it has one, else grown as io.ReadAll grows its own.
// The one byte past limit is not counted, so that a bound of limit fits the largest answer.
// On an error it returns what it read before it.
func (b *answerBuffer) readAll(ctx context.Context, r io.Reader, sizeHint, limit int64) ([]byte, error) {
	most := limit + 1
	size := min(int64(firstAnswerBuffer), most)
	if sizeHint >= 0 {
		size = most
		if sizeHint < limit {
			size = sizeHint + 1 // +1: the read that finds the end needs room
		}
	}
	if err := b.grow(ctx, size, limit); err != nil {
		return nil, err
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) == most {
				return buf, nil
			}
			next := min(2*int64(cap(buf)), most)
			if err := b.grow(ctx, next, limit); err != nil {
				return buf, err
			}
			buf = append(make([]byte, 0, next), buf...)
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// grow counts a buffer of size bytes (at most limit of them) in place of the one counted so
// far, waiting for room as answerMemory says. A wait the caller's context ends returns its
// error; one that runs out returns errAnswerMemoryFull.
func (b *answerBuffer) grow(ctx context.Context, size, limit int64) error {
	n := min(size, limit) - b.n
	if n <= 0 {
		return nil
	}
	if !b.m.sem.TryAcquire(n) {
		b.m.waits.Inc()
		if b.waitUntil.IsZero() {
			b.waitUntil = time.Now().Add(b.m.wait)
		}
		wait, cancel := context.WithDeadline(ctx, b.waitUntil)
		defer cancel()
		if err := b.m.sem.Acquire(wait, n); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("wait for answer memory: %w", ctx.Err())
			}
			return errAnswerMemoryFull
		}
	}
	b.n += n
	b.m.held.Add(float64(n))
	return nil
}

// release gives back everything the buffer counted; safe to call more than once.
func (b *answerBuffer) release() {
	if b.n == 0 {
		return
	}
	b.m.sem.Release(b.n)
	b.m.held.Sub(float64(b.n))
	b.n = 0
}
