package runstate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// oldReleaseLua is RunBudget.Release's script as gateways before e96a7a7 ran it: the call's
// done mark a field of the tally hash (done:<call id>), not a key of its own.
const oldReleaseLua = `
if redis.call('HSETNX', KEYS[1], 'done:' .. ARGV[7], 1) == 1 then
  redis.call('HINCRBY', KEYS[1], 'in_tok', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'cache_read_tok', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'cache_write_tok', ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'out_tok', ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'cost_micro', ARGV[5])
  redis.call('HINCRBY', KEYS[1], 'calls', ARGV[6])
end
redis.call('PEXPIRE', KEYS[1], ARGV[8])
redis.call('HDEL', KEYS[2], 'c:' .. ARGV[7])
return 1`

// TestRunRecordsOfAnOlderGatewayAreReadAlike: during a rolling upgrade, calls of one named run
// are served by old and new gateways, and either settles it (on request, or its reconciler).
// A call tallied by an old gateway (done mark in the tally hash, its release resent) counts
// once in the new gateway's tally read and budget; the run then closes for settlement with
// both calls in its tally; a close mark of the old single-mark form is undone by the new reopen.
func TestRunRecordsOfAnOlderGatewayAreReadAlike(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	const run = "r_mixed"
	// Call 1 on an old gateway: the reservation format is unchanged, its release is the old one.
	if _, err := e.budget.Reserve(ctx, run, "c1", 1000, 400, 1); err != nil {
		t.Fatal(err)
	}
	for range 2 { // resent after a lost reply
		if err := e.rdb.Eval(ctx, oldReleaseLua, []string{e.keys.Usage(run), e.keys.RunBudget(run)},
			10, 0, 0, 20, 300, 1, "c1", 3_600_000).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Call 2 on a new gateway sees what call 1 spent.
	grant, err := e.budget.Reserve(ctx, run, "c2", 1000, 1000, 1)
	if err != nil || grant != 700 {
		t.Fatalf("new gateway's reservation after an old one's call of 300: %d, %v; want 700", grant, err)
	}
	if err := e.budget.Release(ctx, run, "c2", pricing.Usage{Input: 5, Output: 10}, 150, false); err != nil {
		t.Fatal(err)
	}
	got, found, err := e.tally.Get(ctx, run)
	// The old gateway's release counts no ended call: read against the run's row (two ended
	// calls), the run looks to have lost one, and its settle waits once for the lease TTL
	// (AwaitRebuild) before it goes on.
	want := runstate.Tallied{Usage: pricing.Usage{Input: 15, Output: 30}, CostMicro: 450, Calls: 2, Ended: 1, EndedKnown: true}
	if err != nil || !found || got != want {
		t.Fatalf("tally of a run served by both versions: %+v, %v, %v; want %+v", got, found, err, want)
	}
	mark, err := e.budget.CloseRun(ctx, run)
	if err != nil {
		t.Fatalf("close of a run whose calls both ended: %v", err)
	}
	if err := e.budget.ReopenRun(ctx, run, mark); err != nil {
		t.Fatal(err)
	}
	// An old gateway's close (one mark, not a list) is undone by its own mark in the new script.
	if err := e.rdb.HSet(ctx, e.keys.RunBudget(run), "closed", "oldmark").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.budget.Reserve(ctx, run, "c3", 1000, 10, 1); !errors.Is(err, runstate.ErrRunClosed) {
		t.Fatalf("reserve on a run an old gateway closed: %v; want ErrRunClosed", err)
	}
	if err := e.budget.ReopenRun(ctx, run, "oldmark"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.budget.Reserve(ctx, run, "c3", 1000, 10, 1); err != nil {
		t.Fatalf("reserve after the old close was undone: %v", err)
	}
	if err := e.budget.Release(ctx, run, "c3", pricing.Usage{}, 0, false); err != nil {
		t.Fatal(err)
	}
}
