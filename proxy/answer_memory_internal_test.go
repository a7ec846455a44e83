package proxy

import (
	"context"
	"errors"
	"strings"
	"testing"

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
