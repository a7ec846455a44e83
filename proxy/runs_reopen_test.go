package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestSettleWhoseCommitMayHaveLandedKeepsTheRunClosed: a settle's COMMIT goes out and the
// database goes away before it answers; the settle gives up (503). The run is settled all
// the same. Reopening it then let a call of the run admitted before the close (here held up
// in its session claim) reserve and be served, and that call's usage is never charged: its
// run is settled. A settlement whose outcome is unknown must leave the run closed.
func TestSettleWhoseCommitMayHaveLandedKeepsTheRunClosed(t *testing.T) {
	gate := &reserveGate{reached: make(chan struct{}), release: make(chan struct{})}
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	h := newHarnessOn(t, harnessSetup{db: db, redisDialer: wrappedDialer(func(c net.Conn) net.Conn { return &reserveGateConn{Conn: c, g: gate} })}, func(c *config.Config) {
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = 20*time.Second, time.Second
	})
	acfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	acfg.Net = "tcp" // the test's way in, around the lossy network
	admin, err := holds.Open(context.Background(), acfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx := context.Background()
	u, key := h.user("standard")

	first, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-reopen"}) // first call
	runID := first.Header.Get(proxy.RunIDHeader)
	h.settled()

	// The next call is admitted, then its reservation is held on its way to Redis.
	// Its script's 3 keys start with the run's tally (the close's do too, but come later; the
	// release's are 4).
	usage := h.keys.Usage(runID)
	gate.arm(fmt.Sprintf("$1\r\n3\r\n$%d\r\n%s", len(usage), usage))
	second := make(chan *http.Response, 1)
	go func() {
		second <- h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-reopen"})
	}()
	select {
	case <-gate.reached:
	case <-time.After(20 * time.Second):
		t.Fatal("the second call never reached its reservation")
	}

	// The settle commits, and its reply is lost with the database.
	lossy.Arm("settle_token = VALUES(settle_token)", testenv.GoDown)
	status, body := h.settleRun(key, "task-reopen")
	if !lossy.Fired() {
		t.Fatalf("the settlement's commit never went out: %d %s", status, body)
	}
	lossy.Restore()
	var state string
	if err := admin.GetContext(ctx, &state, "SELECT state FROM run_holds WHERE run_id = ?", runID); err != nil || state != "settled" {
		t.Fatalf("run after the settle whose reply was lost: %q, %v (settle answered %d %s)", state, err, status, body)
	}
	close(gate.release)
	resp := <-second
	readAll(t, resp.Body)
	resp.Body.Close()
	r := h.run(u.ID, runID)
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("a call of the run was served after its settlement committed (settle answered %d): run charged %d for %d call(s); the served call is never charged",
			status, r.ChargedMicro, r.Calls)
	}
}

// reserveGate holds back the first write carrying marker, once armed, until released.
type reserveGate struct {
	mu      sync.Mutex
	marker  []byte
	reached chan struct{}
	release chan struct{}
}

func (g *reserveGate) arm(marker string) {
	g.mu.Lock()
	g.marker = []byte(marker)
	g.mu.Unlock()
}

type reserveGateConn struct {
	net.Conn
	g *reserveGate
}

func (c *reserveGateConn) Write(b []byte) (int, error) {
	g := c.g
	g.mu.Lock()
	hit := g.marker != nil && bytes.Contains(b, g.marker)
	if hit {
		g.marker = nil
	}
	g.mu.Unlock()
	if hit {
		close(g.reached)
		<-g.release
	}
	return c.Conn.Write(b)
}
