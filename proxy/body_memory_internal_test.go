package proxy

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBodyMemoryCountsWhatIsReadAndGivesItAllBack: a lease counts every byte its reader
// returns, refuses the read that would pass a bound with nothing counted for it, and its
// release gives back all it counted, once, leaving no caller behind in the map.
func TestBodyMemoryCountsWhatIsReadAndGivesItAllBack(t *testing.T) {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	m := newBodyMemory(100, 60, gauge)

	a := m.lease(1)
	if n, err := a.reader(strings.NewReader(strings.Repeat("a", 50))).Read(make([]byte, 64)); n != 50 || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}
	// The caller's share (60) is passed by 11 more: refused, and nothing of it counted.
	if _, err := m.lease(1).reader(strings.NewReader(strings.Repeat("b", 11))).Read(make([]byte, 64)); !errors.Is(err, errCallerBodyMemory) {
		t.Fatalf("caller over its share: %v", err)
	}
	b := m.lease(2)
	if n, err := b.reader(strings.NewReader(strings.Repeat("c", 50))).Read(make([]byte, 64)); n != 50 || err != nil {
		t.Fatalf("another caller: read %d, %v", n, err)
	}
	// 100 held in all: one more byte of a third caller passes the process's bound.
	if _, err := m.lease(3).reader(strings.NewReader("d")).Read(make([]byte, 64)); !errors.Is(err, errBodyMemoryFull) {
		t.Fatalf("process full: %v", err)
	}
	if got := testutil.ToFloat64(gauge); got != 100 {
		t.Fatalf("gauge %v, want 100", got)
	}
	a.release()
	a.release() // a second release gives nothing back twice
	b.release()
	if m.total != 0 || len(m.byCaller) != 0 || testutil.ToFloat64(gauge) != 0 {
		t.Fatalf("after release: total %d, callers %v, gauge %v", m.total, m.byCaller, testutil.ToFloat64(gauge))
	}

	// A body counted from its Content-Length is not counted again as it is read; what it
	// sends beyond it (a chunked body has none) is.
	c := m.lease(4)
	if err := c.reserve(40); err != nil {
		t.Fatal(err)
	}
	r := c.reader(strings.NewReader(strings.Repeat("e", 45)))
	for _, want := range []int64{40, 40, 45} {
		if _, err := r.Read(make([]byte, 20)); err != nil {
			t.Fatal(err)
		}
		if m.total != want {
			t.Fatalf("counted %d, want %d", m.total, want)
		}
	}
	c.release()
	if m.total != 0 {
		t.Fatalf("after release: %d", m.total)
	}
}

// TestBodyThatFillsABoundExactlyFits: a body that brings its caller's bodies to exactly its
// share fits, and one that brings the process's to exactly its limit does; a byte more past
// both is the caller's refusal (429 too_many_request_bytes, its own share full), a byte more
// of another caller the process's (503 server_busy).
func TestBodyThatFillsABoundExactlyFits(t *testing.T) {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	m := newBodyMemory(100, 60, gauge)
	a := m.lease(1)
	if err := a.reserve(60); err != nil {
		t.Fatalf("a body of exactly the caller's share: %v", err)
	}
	b := m.lease(2)
	if err := b.reserve(40); err != nil {
		t.Fatalf("a body filling the process's limit exactly: %v", err)
	}
	if err := m.lease(1).reserve(1); !errors.Is(err, errCallerBodyMemory) {
		t.Errorf("a byte more of the caller at its share, the process full too: %v, want the caller's share", err)
	} else if aerr := bodyMemoryError(err); aerr.Status != 429 || aerr.Code != "too_many_request_bytes" {
		t.Errorf("answered %d %s, want 429 too_many_request_bytes", aerr.Status, aerr.Code)
	}
	if err := m.lease(3).reserve(1); !errors.Is(err, errBodyMemoryFull) {
		t.Errorf("a byte of another caller, the process full: %v, want the process's limit", err)
	} else if aerr := bodyMemoryError(err); aerr.Status != 503 || aerr.Code != "server_busy" {
		t.Errorf("answered %d %s, want 503 server_busy", aerr.Status, aerr.Code)
	}
	a.release()
	b.release()
	if m.total != 0 || len(m.byCaller) != 0 || testutil.ToFloat64(gauge) != 0 {
		t.Fatalf("after release: total %d, callers %v, gauge %v", m.total, m.byCaller, testutil.ToFloat64(gauge))
	}
}

// TestReservationOfNothingLeavesNoCallerBehind: a lease that reserves nothing (an Idempotency-Key
// replay of an empty stored answer on an empty body) counts its caller in nowhere: its release
// gives back nothing and must find nothing to remove, or the map of callers kept one entry for
// every such caller for the life of the process.
func TestReservationOfNothingLeavesNoCallerBehind(t *testing.T) {
	m := newBodyMemory(100, 60, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}))
	for caller := uint64(1); caller <= 3; caller++ {
		l := m.lease(caller)
		if err := l.reserve(0); err != nil {
			t.Fatalf("caller %d: reserving nothing: %v", caller, err)
		}
		l.release()
	}
	if m.total != 0 || len(m.byCaller) != 0 {
		t.Fatalf("after releases of nothing: total %d, callers %v, want none", m.total, m.byCaller)
	}
}
