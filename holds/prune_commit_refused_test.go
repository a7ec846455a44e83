package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPruneBatchWhoseCommitWasRefusedIsNotCounted: a batch whose COMMIT the server refused
// without running it (a Galera node out of its primary component answers 1047 before running
// anything) is tried again, and its retry finds none of the runs it had deleted gone. Nothing of
// that attempt committed, so it is no batch of the count: `gateway prune` must still print the
// five runs in the two batches that committed them, not a third batch for the refused attempt.
func TestPruneBatchWhoseCommitWasRefusedIsNotCounted(t *testing.T) {
	lossy, st, db := settledRunsToPrune(t, "prune-refused", "r_prune_refused_")
	lossy.Arm("\x03COMMIT", testenv.NotReadyReply) // the statement, not a session variable named after it
	res, err := st.PruneSettled(context.Background(), 8*24*time.Hour, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !lossy.Fired() {
		t.Fatal("no prune batch's commit was refused")
	}
	checkAllPruned(t, db, res, "prune whose first batch's commit was refused unrun")
}
