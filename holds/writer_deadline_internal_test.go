package holds

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestWriterDoesNotStartAnAdmissionWithAMomentLeft: a batch runs under the earliest deadline
// of its admissions, so an admission a worker takes with a moment of its admit_timeout left
// would fail its whole batch with it. It is answered ErrAdmitNotStarted instead, nothing held
// and no transaction begun; one with its deadline already past is too (its caller's own timer
// may not have fired yet).
func TestWriterDoesNotStartAnAdmissionWithAMomentLeft(t *testing.T) {
	for _, left := range []time.Duration{-time.Millisecond, time.Second / minAdmitLeftDiv / 2} {
		batches := 0
		// No store: a transaction begun would panic.
		w := &Writer{cfg: WriterConfig{AdmitTimeout: time.Second, SettleTimeout: time.Minute,
			OnBatch: func(BatchShape) { batches++ }}}
		it := writeItem{admit: &AdmitRequest{RunID: "r_moment_left"}, taken: new(atomic.Int32),
			out: make(chan writeOutcome, 1), deadline: time.Now().Add(left)}
		w.commit([]writeItem{it})
		select {
		case o := <-it.out:
			if !errors.Is(o.err, ErrAdmitNotStarted) {
				t.Errorf("admission with %v left: %v; want ErrAdmitNotStarted", left, o.err)
			}
		default:
			t.Errorf("admission with %v left not answered", left)
		}
		if s := it.taken.Load(); s != itemWithdrawn || batches != 0 {
			t.Errorf("admission with %v left: state %d, %d batches; want withdrawn, none", left, s, batches)
		}
	}
}

// TestWriterDropsAPartsAdmissionWithAMomentLeft: after a refused batch is split, an admission
// of a part with less than a tenth of its admit_timeout left is answered ErrAdmitNotStarted
// (the refused batch committed nothing) and left out of the part, as commit does for a whole
// batch: run, it would fail the part's other items with it. The rest of the part is kept.
func TestWriterDropsAPartsAdmissionWithAMomentLeft(t *testing.T) {
	w := &Writer{cfg: WriterConfig{AdmitTimeout: time.Second, SettleTimeout: time.Minute}}
	now := time.Now()
	late := writeItem{admit: &AdmitRequest{RunID: "r_part_late"}, out: make(chan writeOutcome, 1), deadline: now.Add(time.Second / minAdmitLeftDiv / 2)}
	timely := writeItem{admit: &AdmitRequest{RunID: "r_part_timely"}, out: make(chan writeOutcome, 1), deadline: now.Add(time.Second / 2)}
	settle := writeItem{settle: &Settlement{RunID: "r_part_settle"}, out: make(chan writeOutcome, 1)}
	kept := w.dropLate([]writeItem{late, settle, timely}, now)
	if len(kept) != 2 || kept[0].settle == nil || kept[1].admit == nil || kept[1].admit.RunID != "r_part_timely" {
		t.Errorf("part kept %d items; want the settlement and the admission with half its time left", len(kept))
	}
	select {
	case o := <-late.out:
		if !errors.Is(o.err, ErrAdmitNotStarted) {
			t.Errorf("admission with a moment left: %v; want ErrAdmitNotStarted", o.err)
		}
	default:
		t.Error("admission with a moment left not answered")
	}
	if len(timely.out) != 0 || len(settle.out) != 0 {
		t.Error("an item kept in the part was answered")
	}
}
