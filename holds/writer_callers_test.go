package holds_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWriterAdmissionWhoseCallerLeftLearnsOfItsHold: once a worker has taken an admission,
// its caller's context ending does not end its wait: the batch may commit the hold, and a
// caller told "not started" would never release it, leaving the reconciler to charge it.
// Here the batch waits on the user's row, locked by a console, when the caller's context
// ends; once the lock goes, the caller is answered the hold its batch committed.
func TestWriterAdmissionWhoseCallerLeftLearnsOfItsHold(t *testing.T) {
	_, st, users := storeWithUsers(t, "leftheld", 1)
	u := users[0]
	ctx := context.Background()
	unlock := lockUserRow(t, st, u.ID)
	defer unlock()
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 1, AdmitTimeout: time.Minute, SettleTimeout: 2 * time.Minute})
	defer w.Close()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	run := "r_leftheld_" + testenv.RandomID(6)
	type answer struct {
		h   holds.Hold
		err error
	}
	done := make(chan answer, 1)
	go func() {
		h, err := w.Admit(cctx, holds.AdmitRequest{RunID: run, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		done <- answer{h, err}
	}()
	waitLockWaiter(t, st) // the worker has taken the admission: its batch waits on the row
	cancel()
	unlock()
	a := <-done
	bal, err := st.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if a.err != nil {
		t.Fatalf("the admission whose caller left after its batch started: %v, with %d holds in flight; want the hold its batch committed", a.err, bal.InFlight)
	}
	if a.h.RunID != run || bal.InFlight != 1 {
		t.Fatalf("answered hold %+v, %d in flight; want the one hold of %s", a.h, bal.InFlight, run)
	}
	if _, err := st.Settle(ctx, holds.Settlement{RunID: run, UserID: u.ID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestWriterAdmissionWithdrawnByItsCallerIsNeverStarted: an admission whose caller's context
// ends while it waits for a worker is withdrawn: answered ErrAdmitNotStarted, it must not be
// started later, though a worker frees long before its AdmitTimeout ends (no hold its caller
// does not know of, left to the reconciler to charge).
func TestWriterAdmissionWithdrawnByItsCallerIsNeverStarted(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_withdrawn_stuck")
	other, err := f.store.CreateUser(ctx, fmt.Sprintf("withdrawn-b-%d", f.user.ID), "standard")
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockUserRow(t, f.store, f.user.ID)
	defer unlock()
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: time.Minute, SettleTimeout: 2 * time.Minute})
	defer w.Close()
	stuck := settleAsync(w, holds.Settlement{RunID: "r_withdrawn_stuck", UserID: f.user.ID, CostMicro: 1_000, Source: holds.SourceComplete})
	waitLockWaiter(t, f.store) // the only worker waits on the locked row
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := w.Admit(cctx, holds.AdmitRequest{RunID: "r_withdrawn", UserID: other.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		done <- err
	}()
	waitGathered(t, w, 1)
	cancel()
	if err := <-done; !errors.Is(err, holds.ErrAdmitNotStarted) {
		t.Fatalf("admission whose caller left while it queued: %v, want ErrAdmitNotStarted", err)
	}
	unlock()
	if s := <-stuck; s.err != nil || !s.res.Applied {
		t.Fatalf("settlement after the lock was released: %+v, %v", s.res, s.err)
	}
	w.Close() // every gathered item has been handled
	if bal, err := f.store.Balance(ctx, other.ID); err != nil || bal.InFlight != 0 {
		t.Fatalf("balance %+v, %v: an admission answered ErrAdmitNotStarted was started", bal, err)
	}
}

// TestWriterSettlementOfALeftCallerIsStillCommitted: a settlement is queued whenever there is
// room, whatever its caller's context says, and a caller that stops waiting does not withdraw
// it: settlements offered with their callers' contexts already ended all commit (were any
// dropped, its hold would stay held until the reconciler charged it in full).
func TestWriterSettlementOfALeftCallerIsStillCommitted(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	const n = 16
	f.setMaxInFlight(n)
	for i := range n {
		f.admit(fmt.Sprintf("r_left_settle_%d", i))
	}
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 2, AdmitTimeout: 10 * time.Second, SettleTimeout: time.Minute})
	gone, cancel := context.WithCancel(ctx)
	cancel()
	for i := range n {
		// Its answer (the outcome, or the context's error) is not waited for.
		_, _ = w.Settle(gone, holds.Settlement{RunID: fmt.Sprintf("r_left_settle_%d", i), UserID: f.user.ID, CostMicro: 1_000, Source: holds.SourceComplete})
	}
	w.Close() // commits what is queued
	bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID)
	if err != nil {
		t.Fatal(err)
	}
	if bal.InFlight != 0 || bal.UsedTodayMicro != n*1_000 {
		t.Fatalf("balance %+v after %d settlements of 1,000 offered by callers gone: want all committed", bal, n)
	}
}

// TestWriterSettlementWhoseCallerLeftMidBatchIsAnsweredItsBatch: a caller that stops waiting
// once a worker has started its settlement is answered what the batch did, not its context's
// error: here the batch, waiting on a row a console holds when the caller's context ends,
// commits once the row is free, and Settle says so. It used to answer context.Canceled, and the
// proxy counted and logged a settlement that had committed as one left to the reconciler.
func TestWriterSettlementWhoseCallerLeftMidBatchIsAnsweredItsBatch(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_left_mid_batch")
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: 10 * time.Second, SettleTimeout: time.Minute})
	defer w.Close()
	unlock := lockUserRow(t, f.store, f.user.ID)
	defer unlock() // before Close, which waits for the batch
	callerCtx, leave := context.WithCancel(ctx)
	settled := settleAsyncWith(callerCtx, w, holds.Settlement{RunID: "r_left_mid_batch", UserID: f.user.ID, CostMicro: 3_000, Source: holds.SourceComplete})
	waitLockWaiter(t, f.store) // a worker has taken it: its batch waits for the row
	leave()
	unlock()
	if s := <-settled; s.err != nil || !s.res.Applied || s.res.ChargedMicro != 3_000 {
		t.Fatalf("settlement whose caller left while its batch ran: %+v, %v; want what its batch committed", s.res, s.err)
	}
	if bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID); err != nil || bal.UsedTodayMicro != 3_000 || bal.InFlight != 0 {
		t.Fatalf("balance %+v, %v: want the settlement committed", bal, err)
	}
}

// TestWriterSettlementWhoseCallerLeftWhileQueuedSaysSoAndStillCommits: a caller that stops
// waiting before any worker has taken its settlement is told at once that it is still queued
// (ErrSettleQueued), which is true: it commits in a later batch. Here the one worker is held by
// another user's settlement waiting on a row a console holds.
func TestWriterSettlementWhoseCallerLeftWhileQueuedSaysSoAndStillCommits(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_queued_first")
	other := newSettleFixtureOn(t, f.store.DB())
	other.admit("r_queued_second")
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: 10 * time.Second, SettleTimeout: time.Minute})
	defer w.Close()
	unlock := lockUserRow(t, f.store, f.user.ID)
	defer unlock() // before Close, which waits for the batch
	first := settleAsync(w, holds.Settlement{RunID: "r_queued_first", UserID: f.user.ID, CostMicro: 1_000, Source: holds.SourceComplete})
	waitLockWaiter(t, f.store) // the one worker is taken
	callerCtx, leave := context.WithCancel(ctx)
	second := settleAsyncWith(callerCtx, w, holds.Settlement{RunID: "r_queued_second", UserID: other.user.ID, CostMicro: 2_000, Source: holds.SourceComplete})
	waitGathered(t, w, 1)
	leave()
	if s := <-second; !errors.Is(s.err, holds.ErrSettleQueued) || !errors.Is(s.err, context.Canceled) {
		t.Fatalf("settlement whose caller left while it queued: %+v, %v; want ErrSettleQueued with the caller's reason", s.res, s.err)
	}
	unlock()
	if s := <-first; s.err != nil || !s.res.Applied {
		t.Fatalf("first settlement: %+v, %v", s.res, s.err)
	}
	w.Close() // commits what is queued
	run, err := other.store.Run(ctx, other.user.ID, "r_queued_second")
	if err != nil || run.State != holds.StateSettled || run.SettleSource.String != holds.SourceComplete || run.ChargedMicro != 2_000 {
		t.Fatalf("run %+v, %v: want the queued settlement committed after its caller left", run, err)
	}
}

// TestWriterCloseWaitsForTheBatchInFlight: Close returns once the batches it leaves have
// ended, not before: a process that exits after Close must not cut a batch off mid-way.
// Here the batch waits on a row a console holds; Close must not return until it is free,
// and once it has, the settlement's charge is in the books.
func TestWriterCloseWaitsForTheBatchInFlight(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_close_inflight")
	unlock := lockUserRow(t, f.store, f.user.ID)
	defer unlock()
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: 10 * time.Second, SettleTimeout: time.Minute})
	settled := settleAsync(w, holds.Settlement{RunID: "r_close_inflight", UserID: f.user.ID, CostMicro: 2_000, Source: holds.SourceComplete})
	waitLockWaiter(t, f.store)
	closed := make(chan struct{})
	go func() { w.Close(); close(closed) }()
	// Close cannot return while the lock is held; a second is plenty for one that does not wait.
	select {
	case <-closed:
		t.Fatal("Close returned while its batch still waited for a lock")
	case <-time.After(time.Second):
	}
	unlock()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return once the lock was free")
	}
	if bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID); err != nil || bal.UsedTodayMicro != 2_000 || bal.InFlight != 0 {
		t.Fatalf("balance %+v, %v once Close returned: want the settlement committed", bal, err)
	}
	if s := <-settled; s.err != nil || !s.res.Applied {
		t.Fatalf("settlement: %+v, %v", s.res, s.err)
	}
}

// TestWriterAdmissionIsNotKeptWaitingForASettlementsRetry: when a batch of an admission and a
// settlement fails on the admission's deadline, the admission is answered then; the settlement
// is tried again alone under its own, longer deadline, and its retries do not keep the
// admission's caller waiting. Here the settlement's user row is held by a console, so the
// retry waits until it is free.
func TestWriterAdmissionIsNotKeptWaitingForASettlementsRetry(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_retry_wait_a")
	other, err := f.store.CreateUser(ctx, fmt.Sprintf("retry-wait-b-%d", f.user.ID), "standard")
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockUserRow(t, f.store, f.user.ID)
	defer unlock()
	var seen shapes
	w := holds.NewWriter(f.store, holds.WriterConfig{Linger: time.Minute, AdmitTimeout: 2 * time.Second,
		SettleTimeout: 5 * time.Minute, OnBatch: seen.add})
	defer w.Close()
	settled := settleAsync(w, holds.Settlement{RunID: "r_retry_wait_a", UserID: f.user.ID, CostMicro: 4_000, Source: holds.SourceComplete})
	waitGathered(t, w, 1)
	admitted := make(chan error, 1)
	go func() {
		_, err := w.Admit(ctx, holds.AdmitRequest{RunID: "r_retry_wait_b", UserID: other.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		admitted <- err
	}()
	select {
	case err := <-admitted:
		if err == nil {
			t.Fatal("admission in a batch waiting on a locked row past its deadline succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("admission (admit timeout 2s) still unanswered after 30s: kept waiting for its batch's settlement retried alone")
	}
	unlock()
	if s := <-settled; s.err != nil || !s.res.Applied || s.res.ChargedMicro != 4_000 {
		t.Fatalf("settlement: %+v, %v", s.res, s.err)
	}
	if bal, err := f.store.Balance(ctx, other.ID); err != nil || bal.InFlight != 0 {
		t.Fatalf("balance %+v, %v: the failed admission must leave no hold", bal, err)
	}
}
