package holds_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWriterRidesOutAGaleraNodeNotReady: a Galera node out of its cluster's primary component
// (a network partition, a node rejoining), or set to reject queries for maintenance
// (wsrep_reject_queries), answers every statement 1047 "WSREP has not yet prepared node for
// application use" before it runs it. Nothing of the refused script ran, and the node takes
// statements again once it rejoins (or the address leads to another node), so a batch so
// refused is tried again, as one refused read_only is, whether the refusal meets its first
// script or its closing one. It used to count as one item's refusal: the batch was split down
// to single items, 2n-1 transactions each refused at once, its admissions answered 503 and its
// settlements left to the reconciler, their holds reserved until they expired.
func TestWriterRidesOutAGaleraNodeNotReady(t *testing.T) {
	for _, c := range []struct{ name, marker string }{
		{"at its first script", "START TRANSACTION"},
		{"at its closing script", commitScript},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, lossy := newLossyFixture(t)
			ctx := context.Background()
			f.admit("r_wsrep_prev")
			var mu sync.Mutex
			var shapes []holds.BatchShape
			w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, Linger: 5 * time.Second,
				AdmitTimeout: 10 * time.Second, SettleTimeout: 10 * time.Second,
				OnBatch: func(b holds.BatchShape) { mu.Lock(); shapes = append(shapes, b); mu.Unlock() }})
			defer w.Close()
			lossy.ArmN(c.marker, testenv.NotReadyReply, 3)
			settled := settleAsync(w, holds.Settlement{RunID: "r_wsrep_prev", UserID: f.user.ID, CostMicro: 7_000, Calls: 1,
				Source: holds.SourceComplete})
			waitGathered(t, w, 1)
			hold, aerr := w.Admit(ctx, holds.AdmitRequest{RunID: "r_wsrep_new", UserID: f.user.ID, State: holds.StateRunning,
				TTL: time.Minute, Fresh: true, Token: testenv.RandomID(16)})
			s := <-settled
			if !lossy.Fired() {
				t.Fatal("no script of the batch was refused")
			}
			if aerr != nil || hold.RunID != "r_wsrep_new" {
				t.Errorf("admission refused 1047 three times: %+v, %v; want admitted", hold, aerr)
			}
			if s.err != nil || !s.res.Applied || s.res.ChargedMicro != 7_000 {
				t.Errorf("settlement refused 1047 three times: %+v, %v; want applied, charged 7,000", s.res, s.err)
			}
			mu.Lock()
			got := append([]holds.BatchShape(nil), shapes...)
			mu.Unlock()
			if len(got) != 1 || got[0].Err != nil || got[0].Settlements != 1 || got[0].Admissions != 1 {
				t.Errorf("batches %+v: want the one batch of both, retried until the node took it", got)
			}
			if bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID); err != nil || bal.UsedTodayMicro != 7_000 {
				t.Fatalf("balance %+v, %v: want one charge of 7,000", bal, err)
			}
			if n, state := holdRows(t, f.store, "r_wsrep_new"); n != 1 || state != string(holds.StateRunning) {
				t.Fatalf("the admitted run has %d rows (%s); want its one hold", n, state)
			}
			if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_wsrep_new", Source: holds.SourceRelease}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWriterGaleraNodeNotReadyPastItsDeadline: an admission whose every try a Galera node
// refuses 1047, its closing script included, is refused at its deadline as the database out of
// reach (IsUnavailable: 503 billing_unavailable; its last try may end at the deadline rather
// than at a refusal), and not as ErrOutcomeUnknown: the node ran none of its statements, so
// nothing was held and there is nothing to release.
func TestWriterGaleraNodeNotReadyPastItsDeadline(t *testing.T) {
	f, lossy := newLossyFixture(t)
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: 2 * time.Second, SettleTimeout: 3 * time.Second})
	defer w.Close()
	lossy.ArmN(commitScript, testenv.NotReadyReply, 1_000_000)
	_, err := w.Admit(context.Background(), holds.AdmitRequest{RunID: "r_wsrep_late", UserID: f.user.ID, State: holds.StateRunning,
		TTL: time.Minute, Fresh: true, Token: testenv.RandomID(16)})
	if !lossy.Fired() {
		t.Fatal("the batch's closing script was never refused")
	}
	unavailable := holds.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded)
	if err == nil || !unavailable || errors.Is(err, holds.ErrOutcomeUnknown) {
		t.Errorf("admission refused 1047 until its deadline: %v; want unavailable, not outcome unknown", err)
	}
	if n, _ := holdRows(t, f.store, "r_wsrep_late"); n != 0 {
		t.Fatalf("the refused admission left %d rows", n)
	}
}
