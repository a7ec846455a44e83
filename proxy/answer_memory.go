package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
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
//
// Each caller's answers are bounded too (limits.max_response_memory_per_caller), as its
// request bodies are: an answer leaves memory only once its caller has read it, and a caller
// reading at a trickle (a piece of 64 KiB a client_write_timeout keeps it going) holds it for
// as long. Without the share one caller with a few answers of max_response_bytes in flight (an
// embeddings list of tens of MB costs a fraction of a cent) held the whole bound, and every
// other caller's answer waited, was refused and was charged. An answer past its caller's share
// waits for that caller's other answers to leave, within the same wait, before it waits for
// the process's room.
type answerMemory struct {
	sem       *semaphore.Weighted
	perCaller int64
	wait      time.Duration // answerMemoryWait; shorter in tests
	held      prometheus.Gauge
	waits     prometheus.Counter

	mu      sync.Mutex
	callers map[uint64]*callerAnswers // the callers with answers in memory now, no others
}

// callerAnswers is one caller's share of the answers in memory, and how many of its answers
// are counting against it (the entry goes when the last one is released).
type callerAnswers struct {
	sem     *semaphore.Weighted
	answers int
}

// answerMemoryWait bounds one wait for room. Answers leave memory as fast as their callers
// read them; one still waiting after this is most likely in a deadlock of growing buffers.
const answerMemoryWait = 5 * time.Second

// errAnswerMemoryFull is an answer that found no room within answerMemoryWait;
// errCallerAnswerMemory, which is one too, one that found none in its caller's share.
var (
	errAnswerMemoryFull   = errors.New("whole answers in memory at the process's limit")
	errCallerAnswerMemory = fmt.Errorf("%w: at the caller's share", errAnswerMemoryFull)
)

// firstAnswerBuffer is the first buffer of an answer of unknown length (io.ReadAll's own):
// most answers are a few KiB.
const firstAnswerBuffer = 512

func newAnswerMemory(limit, perCaller int64, held prometheus.Gauge, waits prometheus.Counter) *answerMemory {
	if limit <= 0 || perCaller <= 0 || perCaller > limit {
		panic(fmt.Sprintf("proxy: answer memory %d, per caller %d", limit, perCaller))
	}
	return &answerMemory{sem: semaphore.NewWeighted(limit), perCaller: perCaller, wait: answerMemoryWait, held: held, waits: waits,
		callers: map[uint64]*callerAnswers{}}
}

// buffer starts counting one answer of caller; its release, deferred by the caller, gives back
// what it counted.
func (m *answerMemory) buffer(caller uint64) *answerBuffer {
	m.mu.Lock()
	defer m.mu.Unlock()
	ca := m.callers[caller]
	if ca == nil {
		ca = &callerAnswers{sem: semaphore.NewWeighted(m.perCaller)}
		m.callers[caller] = ca
	}
	ca.answers++
	return &answerBuffer{m: m, caller: caller, share: ca}
}

// answerBuffer is what one answer has counted.
type answerBuffer struct {
	m      *answerMemory
	caller uint64
	share  *callerAnswers // nil once released
	n      int64
	// shared is what it holds of its caller's share: n, or less while it waits for it.
	shared int64
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
	if b.share == nil {
		panic("proxy: answer buffer grown after its release")
	}
	// The caller's share first: an answer waiting for its caller's other answers to leave
	// holds none of the process's room meanwhile.
	if b.share.sem.TryAcquire(n) {
		b.shared += n
	} else {
		// It waits holding none of the share either: two growing answers of a caller (no
		// Content-Length, each past half the share) each held part and waited for what the
		// other held, and both were refused, charged. Given back, the first waiter takes the
		// whole of its new size as the other gives its part back too, and the other follows
		// once it leaves. Its bytes stay counted in the process's room meanwhile.
		b.share.sem.Release(b.shared)
		b.shared = 0
		if err := b.acquire(ctx, b.share.sem, b.n+n, errCallerAnswerMemory); err != nil {
			return err
		}
		b.shared = b.n + n
	}
	if err := b.acquire(ctx, b.m.sem, n, errAnswerMemoryFull); err != nil {
		b.share.sem.Release(b.shared - b.n)
		b.shared = b.n
		return err
	}
	b.n += n
	b.m.held.Add(float64(n))
	return nil
}

// acquire takes n of sem, waiting for room until the answer's waits end (waitUntil, set by
// its first): full is the error when they end without it.
func (b *answerBuffer) acquire(ctx context.Context, sem *semaphore.Weighted, n int64, full error) error {
	if sem.TryAcquire(n) {
		return nil
	}
	b.m.waits.Inc()
	if b.waitUntil.IsZero() {
		b.waitUntil = time.Now().Add(b.m.wait)
	}
	wait, cancel := context.WithDeadline(ctx, b.waitUntil)
	defer cancel()
	if err := sem.Acquire(wait, n); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("wait for answer memory: %w", ctx.Err())
		}
		return full
	}
	return nil
}

// release gives back everything the buffer counted; safe to call more than once.
func (b *answerBuffer) release() {
	if b.share == nil {
		return
	}
	if b.n > 0 {
		b.m.sem.Release(b.n)
		b.m.held.Sub(float64(b.n))
		b.n = 0
	}
	if b.shared > 0 {
		b.share.sem.Release(b.shared)
		b.shared = 0
	}
	b.m.mu.Lock()
	if b.share.answers--; b.share.answers == 0 {
		delete(b.m.callers, b.caller) // the map holds the callers with answers in memory, no more
	}
	b.m.mu.Unlock()
	b.share = nil
}
