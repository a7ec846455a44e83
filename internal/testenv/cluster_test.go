package testenv_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestClusterOnRefusesWhatAClusterRefuses: ClusterOn's client runs a script, a multi-key
// command or a MULTI/EXEC whose keys share a slot, and refuses each across slots (CROSSSLOT,
// ErrCrossSlot), alone or in a pipeline, as a Redis Cluster does; a plain pipeline across slots
// runs, as a Cluster client splits it. Without the refusal, a test through it would pass
// what the single server underneath runs and a Cluster does not.
func TestClusterOnRefusesWhatAClusterRefuses(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	cc := testenv.ClusterOn(t, rdb)
	ctx := context.Background()
	a, a2, b := prefix+"x:{one}", prefix+"y:{one}", prefix+"x:{two}"
	script := redis.NewScript(`return redis.call('SET', KEYS[1], 1) and #KEYS`)
	if err := script.Run(ctx, cc, []string{a, a2}).Err(); err != nil {
		t.Fatalf("script in one slot: %v", err)
	}
	if err := script.Run(ctx, cc, []string{a, b}).Err(); !errors.Is(err, testenv.ErrCrossSlot) {
		t.Errorf("script across slots: %v, want CROSSSLOT", err)
	}
	if err := cc.MGet(ctx, a, b).Err(); !errors.Is(err, testenv.ErrCrossSlot) {
		t.Errorf("MGET across slots: %v, want CROSSSLOT", err)
	}
	if err := cc.MGet(ctx, a, a2).Err(); err != nil {
		t.Errorf("MGET in one slot: %v", err)
	}
	if _, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Eval(ctx, `return 1`, []string{a, b})
		return nil
	}); !errors.Is(err, testenv.ErrCrossSlot) {
		t.Errorf("script across slots in a pipeline: %v, want CROSSSLOT", err)
	}
	if _, err := cc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, a, 1, 0)
		p.Set(ctx, b, 1, 0)
		return nil
	}); !errors.Is(err, redis.ErrCrossSlot) {
		t.Errorf("MULTI/EXEC across slots: %v, want ErrCrossSlot", err)
	}
	if _, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, a, 2, 0)
		p.Set(ctx, b, 2, 0)
		return nil
	}); err != nil {
		t.Errorf("plain pipeline across slots: %v", err)
	}
	if v, err := rdb.Get(ctx, b).Result(); err != nil || v != "2" {
		t.Errorf("the pipeline's write: %q %v", v, err)
	}
}

// TestRedisClusterRefusesWhatClusterOnRefuses: a real Cluster (RedisCluster) refuses a script
// across slots (CROSSSLOT, from the node) and a MULTI/EXEC across slots (ErrCrossSlot, from
// the client), as ClusterOn does; and its nodes place keys by runstate.Slot's figures
// (CLUSTER KEYSLOT). ClusterOn stands for a Cluster only while these hold.
func TestRedisClusterRefusesWhatClusterOnRefuses(t *testing.T) {
	cc := testenv.RedisCluster(t)
	ctx := context.Background()
	a, a2, b := "x:{one}", "y:{one}", "x:{two}"
	for _, k := range []string{a, b, "foo", "r_0123:x", "billing:usage:{agent-7:step.2_x}"} {
		want, err := cc.ClusterKeySlot(ctx, k).Result()
		if err != nil || int(want) != runstate.Slot(k) {
			t.Errorf("CLUSTER KEYSLOT %q = %d (%v), runstate.Slot %d", k, want, err, runstate.Slot(k))
		}
	}
	script := redis.NewScript(`return #KEYS`)
	if err := script.Run(ctx, cc, []string{a, a2}).Err(); err != nil {
		t.Fatalf("script in one slot: %v", err)
	}
	if err := script.Run(ctx, cc, []string{a, b}).Err(); err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
		t.Errorf("script across slots: %v, want CROSSSLOT", err)
	}
	if err := cc.MGet(ctx, a, b).Err(); err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
		t.Errorf("MGET across slots: %v, want CROSSSLOT", err)
	}
	if _, err := cc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, a, 1, 0)
		p.Set(ctx, b, 1, 0)
		return nil
	}); !errors.Is(err, redis.ErrCrossSlot) {
		t.Errorf("MULTI/EXEC across slots: %v, want ErrCrossSlot", err)
	}
}
