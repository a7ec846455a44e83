package holds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestRunCallRecordRefusedByAFullDiskIsTriedAgainUntilThereIsRoom: a named run's record of an
// ended call (RecordRunCall) changes the run's row in place, but it pushes the run's expiry
// out, and expires_at is a key of idx_run_holds_state_expires: the record moves the run's
// entry there to the index's end, which must grow the table once that page is full. On a
// full disk MariaDB refuses it at once, 1114 (README Operating it, Full disks); given up at
// once, the row under-counted the run's ended calls until it settled, and the row's record is
// what keeps a call a Redis restart without persistence lost. Here run_holds lives on a small
// file system of the test's own (it needs root), filled after the runs' admissions; their
// calls are recorded one by one until one is refused for a full table, and room is made once
// the refusal is logged: the record lands within its deadline, on the run's row once.
func TestRunCallRecordRefusedByAFullDiskIsTriedAgainUntilThereIsRoom(t *testing.T) {
	f := newFullDiskFixture(t)
	const runs = 600
	if _, err := f.db.Exec("UPDATE users SET max_in_flight = ?, allowance_micro = ? WHERE id = ?", runs, int64(1)<<50, f.user.ID); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = fmt.Sprintf("r_full_record_%04d", i)
		f.admit(ids[i])
	}
	f.fill()
	u := pricing.Usage{Input: 100, Output: 20}
	for _, run := range ids {
		out := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ok, err := f.store.RecordRunCall(ctx, run, token.New(), time.Hour, u, 1_500, 1, false)
			if err == nil && !ok {
				err = fmt.Errorf("record of %s found no live run", run)
			}
			out <- err
		}()
		err, seen := awaitRefusal(f.logs, out, f.free)
		if err != nil {
			if strings.Contains(err.Error(), "1114") {
				t.Fatalf("a run's call record refused by a full disk, not tried again: %v", err)
			}
			t.Fatal(err)
		}
		if !seen {
			continue
		}
		for _, e := range f.logs.Filter(refusedFull).All() {
			if e.ContextMap()["run_id"] != run {
				t.Errorf("retry logged without its run id: %q %v", e.Message, e.ContextMap())
			}
		}
		var row struct {
			Ended int   `db:"ended_calls"`
			Calls int   `db:"calls"`
			Cost  int64 `db:"cost_micro"`
			In    int64 `db:"in_tok"`
			Out   int64 `db:"out_tok"`
		}
		if err := f.db.Get(&row, "SELECT ended_calls, calls, cost_micro, in_tok, out_tok FROM run_holds WHERE run_id = ?", run); err != nil {
			t.Fatal(err)
		}
		if row.Ended != 1 || row.Calls != 1 || row.Cost != 1_500 || row.In != 100 || row.Out != 20 {
			t.Errorf("run's row %+v; want its one call recorded once: 1 ended, 1 call, 1,500, 100 in, 20 out", row)
		}
		for _, r := range ids {
			if _, err := f.store.Settle(context.Background(), holds.Settlement{RunID: r, Source: holds.SourceRelease}); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	t.Fatal("no call record was refused for a full table: the test proves nothing")
}
