package proxy

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/holds"
)

// TestAdmitPartsObserveTheQueueWaitAndTheBatchTransaction: a batch's admissions are each
// observed in tollgate_call_phase_seconds under admit_queue at their own wait in the writer's
// queue, and under admit_tx at the batch transaction's time, which is what tells the writer's
// share of an admission's wait from the database's.
func TestAdmitPartsObserveTheQueueWaitAndTheBatchTransaction(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	m.observeBatch(holds.BatchShape{Admissions: 2, Settlements: 1, Took: 5 * time.Second,
		AdmitWaits: []time.Duration{time.Second, 2 * time.Second}})
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		count uint64
		sum   float64
	}
	got := map[string]seen{}
	for _, f := range families {
		if f.GetName() != "tollgate_call_phase_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "phase" {
					got[l.GetValue()] = seen{s.GetHistogram().GetSampleCount(), s.GetHistogram().GetSampleSum()}
				}
			}
		}
	}
	for phase, want := range map[string]seen{"admit_queue": {2, 3}, "admit_tx": {2, 10}} {
		if got[phase] != want {
			t.Errorf("phase %s observed %d times, %v s in all; want %d times, %v s", phase, got[phase].count, got[phase].sum, want.count, want.sum)
		}
	}
}
