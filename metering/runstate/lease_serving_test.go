package runstate_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestLeaseServingIsWhileACallOfTheRunRuns: the serving process's reconciler asks Serving
// before Redis, and a run it answers served for is left alone (extended, its settlement
// refused run_busy). It must say so while a call of the run is in flight here, overlapping
// calls included, and not for a run never acquired here or whose last call has ended, written
// by a heartbeat or not: a Serving that answered true for those kept an orphaned run's hold
// alive for as long as the process lived.
func TestLeaseServingIsWhileACallOfTheRunRuns(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	l := runstate.NewLeases(rdb, runstate.Keys{Prefix: prefix}, "process-a", time.Minute, time.Second, zap.NewNop())
	if l.Serving("x_never") {
		t.Fatal("Serving a run never acquired here: true, want false")
	}
	l.Acquire("x_run")
	l.Acquire("x_run")
	if !l.Serving("x_run") {
		t.Fatal("Serving a run with two calls in flight: false, want true")
	}
	if err := l.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, "x_run"); err != nil {
		t.Fatal(err)
	}
	if !l.Serving("x_run") {
		t.Fatal("Serving a run with one of its two calls still in flight: false, want true")
	}
	if err := l.Release(ctx, "x_run"); err != nil {
		t.Fatal(err)
	}
	if l.Serving("x_run") || l.Serving("x_never") {
		t.Fatalf("Serving after the run's last call ended: %v (never acquired: %v), want false for both",
			l.Serving("x_run"), l.Serving("x_never"))
	}
	if n := rdb.Exists(ctx, runstate.Keys{Prefix: prefix}.Lease("x_run")).Val(); n != 0 {
		t.Fatal("lease key left after the run's last call ended")
	}
}
