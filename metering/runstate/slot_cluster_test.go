package runstate_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestSlotAgreesWithARealCluster: Slot is the slot a Redis Cluster puts a key in (CLUSTER
// KEYSLOT), for keys with hash tags of every shape, empty tags among them (the whole key is
// hashed), and for the keys the package names. A key put in another slot than the Cluster's has
// its multi-key work refused (CROSSSLOT) where oneTransaction allowed it, or sent apart where
// one transaction was legal.
func TestSlotAgreesWithARealCluster(t *testing.T) {
	cc := testenv.RedisCluster(t)
	ctx := context.Background()
	keys := runstate.Keys{Prefix: "tollgate:"}
	for _, key := range []string{
		"foo", "{}", "foo{}", "{}bar", "foo{}{bar}", "foo{{bar}}zap", "foo{bar", "foo}bar{x}", "{a}{b}",
		keys.Usage("r_0123"), keys.CallDone("agent-run.1", "c{}"), keys.Dedup(7, "abc"), keys.ReconcileLock(),
	} {
		want, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := runstate.Slot(key); int64(got) != want {
			t.Errorf("Slot(%q) = %d, the Cluster's is %d", key, got, want)
		}
	}
}
