package runstate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestSlotIsRedisClusterHashSlot: Slot is the cluster specification's HASH_SLOT, hash tags
// included: the figures are Redis's own (CLUSTER KEYSLOT, and the specification's CRC16 check
// value 0x31C3 of "123456789").
func TestSlotIsRedisClusterHashSlot(t *testing.T) {
	for key, want := range map[string]int{
		"123456789": 0x31C3, "foo": 12182, "bar": 5061,
		"{foo}.x": 12182, "a{bar}b{foo}": 5061, "foo{}{bar}": runstate.Slot("foo{}{bar}"),
	} {
		if got := runstate.Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	// An empty tag hashes the whole key; the first '}' after the first '{' closes the tag.
	if runstate.Slot("foo{}{bar}") == runstate.Slot("bar") {
		t.Error("an empty hash tag must not make the next one count")
	}
	if runstate.Slot("foo{{bar}}zap") != runstate.Slot("{bar") {
		t.Error(`"foo{{bar}}zap" must hash by "{bar"`)
	}
}

// multiKeyOps are the keys of every script and MULTI/EXEC of this package that names more than
// one key, as the package builds them (see the operation named): each must lie in one hash
// slot, or a Cluster refuses it (CROSSSLOT). A script added with several keys belongs here, and
// in runStateOps, which runs them through a Cluster client.
var multiKeyOps = map[string]func(k runstate.Keys, run, call string) []string{
	"RunBudget.ReserveAtMost (reserveScript)": func(k runstate.Keys, run, call string) []string {
		return []string{k.Usage(run), k.RunBudget(run), k.CallDone(run, call)}
	},
	"RunBudget.Release (releaseScript)": func(k runstate.Keys, run, call string) []string {
		return []string{k.Usage(run), k.RunBudget(run), k.CallDone(run, call), k.Lost(run)}
	},
	"RunBudget.CloseRun (closeScript)": func(k runstate.Keys, run, _ string) []string {
		return []string{k.Usage(run), k.RunBudget(run), k.Lease(run)}
	},
	"Leases.Refresh (leaseBeatScript)": func(k runstate.Keys, run, _ string) []string {
		return []string{k.Lease(run), k.LeaseReleased(run)}
	},
	"Leases.Release (leaseReleaseLua)": func(k runstate.Keys, run, _ string) []string {
		return []string{k.Lease(run), k.LeaseReleased(run)}
	},
	"Tally.RecordCallWith (recordCallLua)": func(k runstate.Keys, run, _ string) []string {
		return []string{k.Usage(run), k.Usage(run)}
	},
}

// TestMultiKeyOperationsShareASlot: DESIGN §9 — the keys each multi-key operation names share
// their run's hash slot, for run and call ids of every shape the gateway makes or accepts, with
// a deployment's prefix or without.
func TestMultiKeyOperationsShareASlot(t *testing.T) {
	runs := []string{"r_0123456789abcdef0123456789abcdef", "x_" + "ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12", "agent-7:step.2_x", "a"}
	for _, prefix := range []string{"", "tollgate-1:"} {
		k := runstate.Keys{Prefix: prefix}
		for name, keys := range multiKeyOps {
			for _, run := range runs {
				ks := keys(k, run, "c_0f1e2d3c")
				for _, key := range ks[1:] {
					if runstate.Slot(key) != runstate.Slot(ks[0]) {
						t.Errorf("%s: %q and %q are in different slots", name, ks[0], key)
					}
				}
			}
		}
	}
}

// TestRunStateOnClusterClient: every operation of this package, run through a Cluster client
// (testenv.ClusterOn: go-redis's Cluster routing and its refusal of a cross-slot MULTI/EXEC,
// and a node's CROSSSLOT refusal of a cross-slot script), does what it does on one server.
func TestRunStateOnClusterClient(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	runStateOps(t, testenv.ClusterOn(t, rdb), runstate.Keys{Prefix: prefix})
}

// TestRunStateOnARealCluster: runStateOps on a Redis Cluster of three masters
// (testenv.RedisCluster), where the runs' keys live on different nodes: the pipelines of a
// beat go to each, and every script and transaction stays in its run's slot.
func TestRunStateOnARealCluster(t *testing.T) {
	cc := testenv.RedisCluster(t)
	keys := runstate.Keys{Prefix: "t" + testenv.RandomID(6) + ":"}
	nodes := map[string]bool{}
	for _, run := range []string{clusterPlainRun, clusterNamedRun, clusterOtherRun} {
		node, err := cc.MasterForKey(context.Background(), keys.Usage(run))
		if err != nil {
			t.Fatal(err)
		}
		nodes[node.Options().Addr] = true
	}
	if len(nodes) != 3 {
		t.Fatalf("the runs' keys are on %d masters, want 3", len(nodes))
	}
	runStateOps(t, cc, keys)
}

// TestTallyJoinsAddOnlyInItsSlotOnACluster: a command may ride in a tally's MULTI/EXEC
// (RecordCallWith) on one server whatever its key; on a Cluster client only in the run's slot — the
// user's fingerprint key is in another, and the transaction was refused whole.
func TestTallyJoinsAddOnlyInItsSlotOnACluster(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	cc := testenv.ClusterOn(t, rdb)
	const run = "r_0123456789abcdef0123456789abcdef"
	fp := keys.Dedup(7, "abc")
	single, cluster := runstate.NewTally(rdb, keys, time.Hour), runstate.NewTally(cc, keys, time.Hour)
	if !single.JoinsAdd(rdb, run, fp) {
		t.Error("one server: a fingerprint may ride in the tally's transaction")
	}
	if single.JoinsAdd(cc, run, fp) {
		t.Error("another client: nothing may ride in the tally's transaction")
	}
	if cluster.JoinsAdd(cc, run, fp) {
		t.Error("Cluster: the user's fingerprint, in another slot, may not ride in the run's tally transaction")
	}
	if !cluster.JoinsAdd(cc, run, keys.Usage(run)) {
		t.Error("Cluster: the run's own keys may ride in its tally transaction")
	}
	// What JoinsAdd refuses is what the Cluster client refuses.
	err := cluster.RecordCallWith(context.Background(), run, 1, pricing.Usage{Input: 1}, 1, false, nil, func(p redis.Pipeliner) { p.Del(context.Background(), fp) })
	if !errors.Is(err, redis.ErrCrossSlot) {
		t.Fatalf("cross-slot RecordCallWith on a Cluster client: %v, want ErrCrossSlot", err)
	}
}

// The runs of runStateOps: in three slots, one in each third of them (each master's, in a
// Cluster of three created by redis-cli).
const clusterPlainRun, clusterNamedRun, clusterOtherRun = "r_00000000000000000000000000000001", "agent-run.1", "agent-run.3"

// runStateOps runs every operation of Tally, Leases and RunBudget through rdb and checks what
// each did: the scripts, transactions and pipelines that touch several keys among them.
func runStateOps(t *testing.T, rdb redis.UniversalClient, keys runstate.Keys) {
	t.Helper()
	ctx := context.Background()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	tally := runstate.NewTally(rdb, keys, time.Hour)
	const plain, named, other = clusterPlainRun, clusterNamedRun, clusterOtherRun
	must("Add", tally.Add(ctx, plain, pricing.Usage{Input: 10, Output: 5}, 100, false))
	must("Add", tally.Add(ctx, plain, pricing.Usage{Input: 1, Output: 2}, 30, false))
	got, found, err := tally.Get(ctx, plain)
	must("Get", err)
	want := runstate.Tallied{Usage: pricing.Usage{Input: 11, Output: 7}, CostMicro: 130, Calls: 2}
	if !found || got != want {
		t.Fatalf("tally %+v (found %v), want %+v", got, found, want)
	}
	recorded := "r_00000000000000000000000000000003"
	must("RecordCallWith", tally.RecordCallWith(ctx, recorded, 2, pricing.Usage{Input: 3}, 30, false, []byte(`{"m":3}`), nil))
	must("RecordCallWith, an earlier write late", tally.RecordCallWith(ctx, recorded, 1, pricing.Usage{Input: 1}, 10, true, nil, nil))
	got, found, err = tally.Get(ctx, recorded)
	must("Get", err)
	if want := (runstate.Tallied{Usage: pricing.Usage{Input: 3}, CostMicro: 30, Calls: 1, PriceSnapshot: `{"m":3}`}); !found || got != want {
		t.Fatalf("one-call run's tally %+v (found %v), want %+v", got, found, want)
	}
	// Its age, from the write time its script stamped and the clock of the server holding it.
	if _, age, _, err := tally.GetAged(ctx, recorded); err != nil || age < 0 || age >= time.Minute {
		t.Fatalf("one-call run's tally written just now aged %v (%v)", age, err)
	}
	must("MarkUnused", tally.MarkUnused(ctx, "r_00000000000000000000000000000002"))
	must("MarkRefused", tally.MarkRefused(ctx, plain, "tok"))
	if ok, err := tally.Refused(ctx, plain, "tok"); err != nil || !ok {
		t.Fatalf("Refused: %v %v", ok, err)
	}

	leases := runstate.NewLeases(rdb, keys, "process-a", time.Minute, time.Second, zap.NewNop())
	leases.Acquire(named)
	leases.Acquire(other)
	must("lease Refresh", leases.Refresh(ctx)) // one pipeline, the runs in two slots
	for _, run := range []string{named, other} {
		if n, err := rdb.Exists(ctx, keys.Lease(run)).Result(); err != nil || n != 1 {
			t.Fatalf("lease of %s after Refresh: %d %v", run, n, err)
		}
	}

	b := runstate.NewRunBudget(rdb, keys, time.Hour, time.Hour, time.Minute)
	if _, err := b.CloseRun(ctx, named); !errors.Is(err, runstate.ErrRunBusy) {
		t.Fatalf("CloseRun of a leased run: %v, want ErrRunBusy", err)
	}
	must("lease Release", leases.Release(ctx, named))
	must("lease Release", leases.Release(ctx, other))
	for _, run := range []string{named, other} {
		g, err := b.ReserveAtMost(ctx, run, "c1", 1000, 400, 10, 4, 0)
		if err != nil || g != 400 {
			t.Fatalf("ReserveAtMost %s: %d %v", run, g, err)
		}
	}
	if lost, err := b.Refresh(ctx); err != nil || len(lost) != 0 { // one pipeline across two slots
		t.Fatalf("budget Refresh: %v %v", lost, err)
	}
	if _, err := b.ReleaseBeforeRecord(ctx, named, "c1", pricing.Usage{Input: 3}, 300, false); err != nil {
		t.Fatalf("ReleaseBeforeRecord: %v", err)
	}
	must("Recorded", b.Recorded(ctx, named, "c1"))
	must("Release", b.Release(ctx, other, "c1", pricing.Usage{Input: 1}, 100, false))
	if g, err := b.ReserveAtMost(ctx, named, "c2", 1000, 1000, 10, 4, 0); err != nil || g != 700 {
		t.Fatalf("ReserveAtMost after a call of 300: %d %v, want 700", g, err)
	}
	must("Release", b.Release(ctx, named, "c2", pricing.Usage{}, 0, false))
	mark, err := b.CloseRun(ctx, named)
	must("CloseRun", err)
	if _, err := b.ReserveAtMost(ctx, named, "c3", 1000, 100, 10, 4, 0); !errors.Is(err, runstate.ErrRunClosed) {
		t.Fatalf("ReserveAtMost on a closed run: %v", err)
	}
	must("ReopenRun", b.ReopenRun(ctx, named, mark))
	if err := b.AwaitRebuild(ctx, named); !errors.Is(err, runstate.ErrRunBusy) {
		t.Fatalf("AwaitRebuild: %v, want ErrRunBusy", err)
	}
	got, found, err = tally.Get(ctx, named)
	must("Get", err)
	if !found || got.CostMicro != 300 || got.Calls != 1 {
		t.Fatalf("tally of %s: %+v (found %v), want its one call of 300", named, got, found)
	}
}
