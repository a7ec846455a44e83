package holds_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWriterQueueBehindAStalledBatchIsBounded: behind a batch that the database keeps waiting
// (a settlement on a user row an operator's console holds locked, retried within its
// settle_timeout), the writer holds no more than one gathered batch and its queue. An
// admission past them waits for room up to admit_timeout and is answered ErrAdmitNotStarted
// (503 billing_unavailable, nothing held: "queue full"); so is one inside them that no worker
// took in time; a settlement past them fails back to its caller on its deadline (left to the
// reconciler, its hold untouched). Nothing grows with the callers: each waits on its own
// deadline, and once the lock goes, the stalled settlement commits once.
func TestWriterQueueBehindAStalledBatchIsBounded(t *testing.T) {
	db, st, users := storeWithUsers(t, "queue", 2)
	ctx := context.Background()
	a, b := users[0], users[1]
	for _, h := range []struct {
		run  string
		user uint64
	}{{"r_queue_stalled", a.ID}, {"r_queue_late_settle", b.ID}} {
		if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: h.run, UserID: h.user, State: holds.StateRunning, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}

	console := testenv.ConsoleTx(t, db)
	if _, err := console.Exec("SELECT id FROM users WHERE id = ? FOR UPDATE", a.ID); err != nil {
		t.Fatal(err)
	}
	const queue, admitTimeout = 2, time.Second
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 1, MaxBatch: 1, Queue: queue,
		AdmitTimeout: admitTimeout, SettleTimeout: time.Minute})
	defer w.Close()
	stalled := settleAsync(w, holds.Settlement{RunID: "r_queue_stalled", UserID: a.ID, CostMicro: 1_000, Source: holds.SourceComplete})
	obs, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	waitLockWaits(t, obs, 1) // the only worker waits on a's row

	const n = 1 + queue + 3 // one gathered, queue queued, three past the bound
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = w.Admit(ctx, holds.AdmitRequest{RunID: fmt.Sprintf("r_queue_b%d", i), UserID: b.ID,
				State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		}()
	}
	wg.Wait()
	full := 0
	for i, err := range errs {
		if !errors.Is(err, holds.ErrAdmitNotStarted) {
			t.Errorf("admission %d behind the stalled batch: %v, want ErrAdmitNotStarted (nothing held)", i, err)
			continue
		}
		if strings.Contains(err.Error(), "queue full") {
			full++
		}
	}
	if full != n-1-queue {
		t.Errorf("%d admissions found the queue full, want the %d past its bound: %v", full, n-1-queue, errs)
	}
	// A settlement past the bound fails back to its caller on its own deadline.
	sctx, cancel := context.WithTimeout(ctx, admitTimeout)
	_, err = w.Settle(sctx, holds.Settlement{RunID: "r_queue_late_settle", UserID: b.ID, CostMicro: 2_000, Source: holds.SourceComplete})
	cancel()
	if err == nil || !strings.Contains(err.Error(), "queue full") {
		t.Errorf("a settlement past the queue's bound: %v, want it refused, queue full", err)
	}
	var heldB int
	if err := db.Get(&heldB, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND run_id LIKE 'r_queue_b%'", b.ID); err != nil {
		t.Fatal(err)
	}
	if heldB != 0 {
		t.Errorf("%d holds taken by admissions answered ErrAdmitNotStarted", heldB)
	}

	if err := console.Rollback(); err != nil {
		t.Fatal(err)
	}
	if s := <-stalled; s.err != nil || !s.res.Applied || s.res.ChargedMicro != 1_000 {
		t.Fatalf("the stalled settlement once the lock went: %+v, %v", s.res, s.err)
	}
	// The settlement refused for room is the reconciler's: its hold is untouched, and settles once.
	res, err := w.Settle(ctx, holds.Settlement{RunID: "r_queue_late_settle", UserID: b.ID, CostMicro: 2_000, Source: holds.SourceReconcile})
	if err != nil || !res.Applied || res.ChargedMicro != 2_000 {
		t.Fatalf("the settlement refused for room, settled later: %+v, %v", res, err)
	}
}
