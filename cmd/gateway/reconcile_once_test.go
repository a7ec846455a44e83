package main

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestReconcileOnceSaysWhichBoundStoppedIt: `reconcile -once` said "stopped at the batch
// limit" of every truncated pass, also of one its time budget stopped, sending the operator
// to look at reconcile_batch when the holds were slow. It names the bound the pass reports.
func TestReconcileOnceSaysWhichBoundStoppedIt(t *testing.T) {
	for _, tc := range []struct {
		st         holds.Stats
		want, miss string
	}{
		{holds.Stats{Scanned: 10000, Batches: 50, Truncated: true, StoppedAt: holds.StopBatchLimit}, "stopped at the batch limit; run again", "time budget"},
		{holds.Stats{Scanned: 7, Batches: 1, Truncated: true, StoppedAt: holds.StopTimeBudget}, "stopped at the time budget; run again", "batch limit"},
		{holds.Stats{Scanned: 3, Batches: 1}, "charged 0 credits", "stopped"},
		{holds.Stats{Scanned: 3, Batches: 1, ChargedHeld: 2, BroughtIn: 2}, "; 2 of them holds of dead gateway processes", "stopped"},
		{holds.Stats{Scanned: 3, Batches: 1, ChargedHeld: 2}, "charged 0 credits", "dead gateway"},
	} {
		got := passSummary(tc.st, 1_000_000)
		if !strings.Contains(got, tc.want) || strings.Contains(got, tc.miss) {
			t.Errorf("summary of %+v:\n%s\nwant %q, not %q", tc.st, got, tc.want, tc.miss)
		}
	}
}
