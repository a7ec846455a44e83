package holds_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// shardDownLeases is the lease checker of a Redis Cluster whose shard holding some runs'
// lease keys is down, the rest of the cluster answering.
type shardDownLeases struct {
	leaseKeys
	runs map[string]bool
}

func (l shardDownLeases) Exists(ctx context.Context, runID string) (bool, error) {
	if l.runs[runID] {
		return false, fmt.Errorf("redis: CLUSTERDOWN the slot of %s is not served", runID)
	}
	return l.leaseKeys.Exists(ctx, runID)
}

// TestDeadRowWhoseLeaseCannotBeReadDoesNotStallTheSweep: the first hold of the oldest dead row
// has a lease that cannot be read, every pass. That hold is left to its expiry, as a leased one
// is, but the sweep goes on: the row's other hold and the next row's are brought in and
// settled. The sweep stopped at the first lease it could not read, and every pass began there
// again: no dead instance's hold behind it was brought in, their callers' slots taken until
// hold_ttl. In batches of one, the failing hold is a batch of which no lease could be read (as
// in an outage): the sweep stops there, and the next pass goes on after it.
func TestDeadRowWhoseLeaseCannotBeReadDoesNotStallTheSweep(t *testing.T) {
	for _, batch := range []int{10, 1} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			e := newStoreEnv(t)
			u := e.user("unread-user", 5, nil)
			retired := func(name string, runs ...string) {
				in, err := e.store.RegisterInstance(e.ctx(), name, deadBound, 0, e.log)
				if err != nil {
					t.Fatal(err)
				}
				for _, run := range runs {
					e.admitBy(u, run, "", in.ID(), holds.StateRunning)
				}
				if err := in.Retire(e.ctx()); err != nil {
					t.Fatal(err)
				}
			}
			retired("shard-down", "r_a_unreadable", "r_b_after")
			retired("killed-behind", "r_c_behind")
			rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
				c.DeadAfter, c.Batch = deadBound, batch
				c.Leases = shardDownLeases{leaseKeys{e.rdb, e.keys}, map[string]bool{"r_a_unreadable": true}}
			})
			for pass := 1; pass <= 2; pass++ {
				if _, err := e.pass(rec); err != nil {
					t.Fatalf("pass %d: %v", pass, err)
				}
			}
			for _, run := range []string{"r_b_after", "r_c_behind"} {
				if r := e.run(u, run); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcileHold {
					t.Errorf("hold %s behind the unreadable lease, after two passes: %s by %q; want brought in and settled at its hold",
						run, r.State, r.SettleSource.String)
				}
			}
			if r := e.run(u, "r_a_unreadable"); r.State != holds.StateRunning {
				t.Errorf("the hold whose lease cannot be read: %s; want left to its expiry", r.State)
			}
		})
	}
}
