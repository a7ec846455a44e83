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
