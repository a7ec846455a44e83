package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestAnswerMemoryGivesItAllBack: what an answer counted goes back whole — the process's
// room, its caller's share, and its caller's entry in the map once its last answer leaves —
// whether it was read or found no room; and an answer whose caller left while it waited says
// so, not that memory was full. Kept, a share's part of a refused answer starved the caller's
// next answers until the refused one's release, and the map held every caller ever served.
func TestAnswerMemoryGivesItAllBack(t *testing.T) {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	m := newAnswerMemory(1000, 600, gauge, prometheus.NewCounter(prometheus.CounterOpts{Name: "w"}))
	ctx := context.Background()

	a, b, other := m.buffer(1), m.buffer(1), m.buffer(2)
	for i, buf := range []*answerBuffer{a, b, other} {
		if got, err := buf.readAll(ctx, strings.NewReader(strings.Repeat("x", 200)), -1, 250); err != nil || len(got) != 200 {
			t.Fatalf("answer %d: read %d, %v", i, len(got), err)
		}
	}
	// 750 of the process's 1000 counted (up to 250 each): caller 2's share has room for 300
	// more, the process has not. Its caller leaves while it waits for that room.
	left, cancel := context.WithCancel(ctx)
	cancel()
	big := m.buffer(2)
	if _, err := big.readAll(left, strings.NewReader(strings.Repeat("y", 300)), 300, 300); !errors.Is(err, context.Canceled) || errors.Is(err, errAnswerMemoryFull) {
		t.Fatalf("answer whose caller left while it waited: %v, want the caller's leaving", err)
	}
	// Refused, it holds none of its caller's share.
	if !big.share.sem.TryAcquire(600 - other.shared) {
		t.Fatalf("caller 2's share still held by an answer that found no room")
	}
	big.share.sem.Release(600 - other.shared)
	big.release()

	a.release()
	a.release() // a second release gives nothing back twice
	b.release()
	other.release()
	if len(m.callers) != 0 || testutil.ToFloat64(gauge) != 0 || !m.sem.TryAcquire(1000) {
		t.Fatalf("after release: callers %v, gauge %v, or the process's room not whole", m.callers, testutil.ToFloat64(gauge))
	}
}

// TestAnswerPastABoundOfDoubledBuffersIsTooLarge: an answer of unknown length is read into a
// buffer doubled from firstAnswerBuffer, up to one byte past the bound, which is how an answer
// too large to relay is told. With a bound the doublings land on exactly (1024, 4096, …), the
// buffer is full at the bound before that byte is read: taken for the end, an answer past the
// bound would be relayed cut at it, as if whole. Each such bound reads the byte past it; an
// answer of exactly the bound is read whole.
func TestAnswerPastABoundOfDoubledBuffersIsTooLarge(t *testing.T) {
	m := newAnswerMemory(1<<20, 1<<20, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}),
		prometheus.NewCounter(prometheus.CounterOpts{Name: "w"}))
	for _, limit := range []int64{firstAnswerBuffer, 2 * firstAnswerBuffer, 8 * firstAnswerBuffer} {
		for _, size := range []int64{limit, limit + 1, limit + 100} {
			b := m.buffer(1)
			got, err := b.readAll(context.Background(), strings.NewReader(strings.Repeat("x", int(size))), -1, limit)
			b.release()
			if want := min(size, limit+1); err != nil || int64(len(got)) != want {
				t.Errorf("bound %d, answer of %d bytes: read %d, %v; want %d (one past the bound tells it too large)",
					limit, size, len(got), err, want)
			}
		}
	}
}

// newTestAnswerMemory is an answer memory of limit bytes, perCaller of them a caller's share,
// whose answers wait for room up to wait, with the counter of their waits.
func newTestAnswerMemory(limit, perCaller int64, wait time.Duration) (*answerMemory, prometheus.Counter) {
	waits := prometheus.NewCounter(prometheus.CounterOpts{Name: "w"})
	m := newAnswerMemory(limit, perCaller, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}), waits)
	m.wait = wait
	return m, waits
}

// readKnown reads an answer of size bytes with its Content-Length into b, at most limit.
func readKnown(b *answerBuffer, size int, limit int64) error {
	got, err := b.readAll(context.Background(), strings.NewReader(strings.Repeat("x", size)), int64(size), limit)
	if err == nil && len(got) != size {
		err = fmt.Errorf("read %d of %d bytes", len(got), size)
	}
	return err
}

// TestAnswerReleasedTwiceGivesItsCallersShareBackOnce: an answer released gives its part of
// its caller's share back, so that the caller's next answer fits in it; released again, it
// gives nothing more back, and its caller's other answer still counts against the share
// (dropped with the entry, the share began again from nothing beside it).
func TestAnswerReleasedTwiceGivesItsCallersShareBackOnce(t *testing.T) {
	m, _ := newTestAnswerMemory(2000, 600, 20*time.Millisecond)
	a, b := m.buffer(1), m.buffer(1)
	for i, buf := range []*answerBuffer{a, b} {
		if err := readKnown(buf, 299, 1000); err != nil { // 300 counted: the read finding the end needs room
			t.Fatalf("answer %d: %v", i, err)
		}
	}
	a.release()
	a.release()
	c := m.buffer(1)
	if err := readKnown(c, 299, 1000); err != nil {
		t.Fatalf("the caller's answer in the room its released one gave back: %v", err)
	}
	d := m.buffer(1)
	if err := readKnown(d, 0, 1000); !errors.Is(err, errCallerAnswerMemory) {
		t.Errorf("a byte more of the caller, its share held by two answers: %v, want its share full", err)
	}
	for _, buf := range []*answerBuffer{b, c, d} {
		buf.release()
	}
	if len(m.callers) != 0 || !m.sem.TryAcquire(2000) {
		t.Fatalf("after release: callers %v, or the process's room not whole", m.callers)
	}
}

// TestGrowingAnswerWaitingForItsCallersShareCountsItsWholeBuffer: an answer of unknown
// length whose next buffer does not fit in its caller's share gives back its part and waits
// for the whole of the new one, and has it counted in the share once it has it: it reads on
// only once the caller's other answer leaves, and given back, its whole buffer is room again
// for the caller's next answer.
func TestGrowingAnswerWaitingForItsCallersShareCountsItsWholeBuffer(t *testing.T) {
	m, waits := newTestAnswerMemory(10000, 1100, 10*time.Second)
	a := m.buffer(1)
	if err := readKnown(a, 299, 5000); err != nil {
		t.Fatal(err)
	}
	// 512 fits beside a's 300; 1024 does not, but does once a leaves.
	b := m.buffer(1)
	done := make(chan error, 1)
	go func() {
		got, err := b.readAll(context.Background(), strings.NewReader(strings.Repeat("y", 800)), -1, 5000)
		if err == nil && len(got) != 800 {
			err = fmt.Errorf("read %d of 800 bytes", len(got))
		}
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(waits) < 1 {
		select {
		case err := <-done:
			t.Fatalf("the growing answer read (%v) without waiting, its buffer of 1024 past its caller's share beside 300", err)
		case <-time.After(time.Millisecond): // polling the counter, as waitGauge polls a metric
		}
		if time.Now().After(deadline) {
			t.Fatal("the growing answer never waited for its caller's share")
		}
	}
	a.release()
	if err := <-done; err != nil {
		t.Fatalf("the growing answer once the caller's other one left: %v", err)
	}
	m.wait = 20 * time.Millisecond
	c := m.buffer(1) // keeps the caller's entry, and its share, while b leaves
	if err := readKnown(c, 77, 5000); !errors.Is(err, errCallerAnswerMemory) {
		t.Errorf("78 bytes beside the grown answer's 1024 in a share of 1100: %v, want its share full", err)
	}
	b.release()
	if err := readKnown(c, 999, 5000); err != nil {
		t.Errorf("the caller's answer of 1000 once the grown one left its share of 1100: %v", err)
	}
	c.release()
	if len(m.callers) != 0 || !m.sem.TryAcquire(10000) {
		t.Fatalf("after release: callers %v, or the process's room not whole", m.callers)
	}
}

// TestAnswerWaitsEndWhereItsFirstWaitSetThem: an answer's waits for room are bounded all
// together by its first (answerMemoryWait), not each: an answer growing its buffer in up to 16
// steps otherwise waited up to 16 times as long, its caller with it. Its first wait run out,
// a second finding no room is refused at once, though room comes while a wait of its own
// would still run.
func TestAnswerWaitsEndWhereItsFirstWaitSetThem(t *testing.T) {
	m, waits := newTestAnswerMemory(1000, 1000, 20*time.Millisecond)
	if !m.sem.TryAcquire(1000) {
		t.Fatal("room in use")
	}
	b := m.buffer(1)
	defer b.release()
	if err := b.grow(context.Background(), 100, 1000); !errors.Is(err, errAnswerMemoryFull) {
		t.Fatalf("first wait, no room: %v, want errAnswerMemoryFull", err)
	}
	m.wait = time.Minute // a wait begun anew would run long past the room coming
	freed, returned := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(freed)
		for testutil.ToFloat64(waits) < 2 {
			select {
			case <-returned: // grow is back without a second wait: nothing to free it from
				return
			case <-time.After(time.Millisecond): // polling the counter, as waitGauge polls a metric
			}
		}
		m.sem.Release(1000)
	}()
	err := b.grow(context.Background(), 100, 1000)
	close(returned)
	<-freed
	if !errors.Is(err, errAnswerMemoryFull) {
		t.Errorf("a second wait after the first ran out: %v, want errAnswerMemoryFull at once", err)
	}
}
