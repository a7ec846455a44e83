package runstate_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(b []byte) (int, error) {
	k, err := c.Conn.Read(b)
	c.n.Add(int64(k))
	return k, err
}

// TestTallyReadDoesNotGrowWithCalls: older versions left a done:<call id> field in the run's
// tally hash (what makes Release safe to repeat), also for a call that used nothing
// (an upstream 4xx, a refusal after reserving). Reading the tally — the reconciler, a client
// settle, every GET /v1/runs/{id} — must read its six figures, not every call the run made.
func TestTallyReadDoesNotGrowWithCalls(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	const run, calls = "r_many_calls", 5000
	p := e.rdb.Pipeline()
	for i := range calls {
		// What RunBudget.Release leaves for a call that used nothing.
		p.HSetNX(ctx, e.keys.Usage(run), "done:"+callID(i)+"0123456789abcdef0123456789", 1)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// One real call, through the real path.
	if _, err := e.budget.Reserve(ctx, run, "real", 1_000_000, 1000, 10); err != nil {
		t.Fatal(err)
	}
	if err := e.budget.Release(ctx, run, "real", pricing.Usage{Input: 10, Output: 5}, 123, false); err != nil {
		t.Fatal(err)
	}

	var read atomic.Int64
	opt := *e.rdb.Options()
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{c, &read}, nil
	}
	counted := redis.NewClient(&opt)
	defer counted.Close()
	if err := counted.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	read.Store(0)
	tl, found, err := runstate.NewTally(counted, e.keys, time.Hour).Get(ctx, run)
	if err != nil || !found || tl.CostMicro != 123 || tl.Calls != 1 {
		t.Fatalf("tally %+v %v %v", tl, found, err)
	}
	if n := read.Load(); n > 4096 {
		t.Fatalf("reading one run's tally read %d bytes from Redis (%d calls' fields): it grows with every call the run made", n, calls)
	}
}
