package testenv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/metering/runstate"
)

// ClusterOn is a Redis Cluster client whose every hash slot is served by the one Redis rdb
// talks to: go-redis applies its Cluster rules to whatever goes through it (each command sent
// to its key's slot, a pipeline split by node, a MULTI/EXEC across slots refused before it is
// sent: ErrCrossSlot), and it refuses as a Cluster node does (CROSSSLOT) a script or a
// multi-key command whose keys are in more than one slot, which the single server underneath
// would run. What works through it works on a Cluster as far as keys and slots go; failover,
// resharding and MOVED replies are a real cluster's. Closed at cleanup.
func ClusterOn(t testing.TB, rdb *redis.Client) *redis.ClusterClient {
	t.Helper()
	o := rdb.Options()
	if o.DB != 0 {
		t.Fatalf("a Cluster has database 0 only; the test Redis is at %d", o.DB)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: runstate.ClusterSlots - 1, Nodes: []redis.ClusterNode{{Addr: o.Addr}}}}, nil
		},
		Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
	})
	cc.AddHook(crossSlotRefusal{})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// ErrCrossSlot is how ClusterOn's client refuses a command whose keys span slots, in a Cluster
// node's words.
var ErrCrossSlot = errors.New("CROSSSLOT Keys in request don't hash to the same slot")

// crossSlotRefusal refuses commands whose keys span hash slots (commandKeys), alone or in a
// pipeline, before they are sent.
type crossSlotRefusal struct{}

func (crossSlotRefusal) DialHook(next redis.DialHook) redis.DialHook { return next }

func (crossSlotRefusal) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := checkSlots(cmd); err != nil {
			return err
		}
		return next(ctx, cmd)
	}
}

func (crossSlotRefusal) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var refused error
		for _, cmd := range cmds {
			if err := checkSlots(cmd); err != nil && refused == nil {
				refused = err
			}
		}
		if refused != nil {
			return refused // none of them sent, as go-redis does with a cross-slot MULTI/EXEC
		}
		return next(ctx, cmds)
	}
}

func checkSlots(cmd redis.Cmder) error {
	keys := commandKeys(cmd)
	for _, k := range keys[min(1, len(keys)):] {
		if runstate.Slot(k) != runstate.Slot(keys[0]) {
			err := fmt.Errorf("%w: %s %q", ErrCrossSlot, cmd.Name(), keys)
			cmd.SetErr(err)
			return err
		}
	}
	return nil
}

// commandKeys are the keys cmd names, for the commands that can name more than one (scripts
// and functions by their key count; MGET, DEL and the like; MSET's every other argument); nil
// for any other.
func commandKeys(cmd redis.Cmder) []string {
	args := cmd.Args()
	str := func(from int, step int) []string {
		var keys []string
		for i := from; i < len(args); i += step {
			keys = append(keys, fmt.Sprint(args[i]))
		}
		return keys
	}
	switch strings.ToLower(cmd.Name()) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		if len(args) < 3 {
			return nil
		}
		n, err := strconv.Atoi(fmt.Sprint(args[2]))
		if err != nil || n < 0 || 3+n > len(args) {
			return nil
		}
		return str(3, 1)[:n]
	case "mget", "del", "unlink", "exists", "touch", "watch", "sinter", "sunion", "sdiff", "pfcount", "pfmerge",
		"sinterstore", "sunionstore", "sdiffstore":
		return str(1, 1)
	case "mset", "msetnx":
		return str(1, 2)
	case "rename", "renamenx", "smove", "lmove", "rpoplpush", "copy":
		if len(args) < 3 {
			return nil
		}
		return str(1, 1)[:2]
	}
	return nil
}

// ensure the hook's signature is go-redis's.
var _ redis.Hook = crossSlotRefusal{}
