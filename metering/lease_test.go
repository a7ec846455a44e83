package metering_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering"
)

// TestLeaseReleaseKeepsAnotherProcessLease: calls of one named run served by two processes
// both lease it; when the first ends, the lease the second wrote last stays.
func TestLeaseReleaseKeepsAnotherProcessLease(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := metering.Keys{Prefix: prefix}
	ctx := context.Background()
	a := metering.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())
	b := metering.NewLeases(rdb, keys, "process-b", time.Minute, time.Second, zap.NewNop())
	a.Acquire("x_shared")
	b.Acquire("x_shared")
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil { // b wrote last
		t.Fatal(err)
	}
	if err := a.Release(ctx, "x_shared"); err != nil {
		t.Fatal(err)
	}
	if v := rdb.Get(ctx, keys.Lease("x_shared")).Val(); v != "process-b" {
		t.Fatalf("lease after a's call ended: %q, want b's still there", v)
	}
	if err := b.Release(ctx, "x_shared"); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, keys.Lease("x_shared")).Val(); n != 0 {
		t.Fatal("lease left after the last call of the run ended")
	}
}
