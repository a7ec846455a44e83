package proxy_test

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// releaseGate holds, once armed, a named run's call release (the script that tallies the call
// and gives its reservation back: the only command of a call that names its run's lost mark) on
// its way to Redis until opened.
type releaseGate struct {
	mu      sync.Mutex
	mark    []byte        // the lost mark of the run whose release is held; nil: not armed
	blocked chan struct{} // closed when a release reaches the gate
	open    chan struct{}
	once    sync.Once
}

type releaseGateConn struct {
	net.Conn
	g *releaseGate
}

func (c *releaseGateConn) Write(p []byte) (int, error) {
	c.g.mu.Lock()
	mark := c.g.mark
	c.g.mu.Unlock()
	if mark != nil && bytes.Contains(p, mark) {
		c.g.once.Do(func() { close(c.g.blocked) })
		<-c.g.open
	}
	return c.Conn.Write(p)
}

// TestNamedRunBrokenStreamIsTalliedBeforeItsErrorEvent: the error event that ends a named
// run's broken stream is the end of that call's answer, so, as for a clean end, the call is
// tallied (its reservation given back) before it is sent: a settle sent the moment the caller
// has it charges the call, rather than being told 409 run_busy for a call it saw end.
func TestNamedRunBrokenStreamIsTalliedBeforeItsErrorEvent(t *testing.T) {
	gate := &releaseGate{blocked: make(chan struct{}), open: make(chan struct{})}
	h := newHarnessOn(t, harnessSetup{redisDialer: wrappedDialer(func(c net.Conn) net.Conn { return &releaseGateConn{Conn: c, g: gate} })}, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-broken-end"}
	first := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "5"))
	readAll(t, first.Body)
	first.Body.Close()
	runID := first.Header.Get(proxy.RunIDHeader)
	h.settled()

	gate.mu.Lock()
	gate.mark = []byte(h.keys.Lost(runID))
	gate.mu.Unlock()
	var openOnce sync.Once
	openGate := func() { openOnce.Do(func() { close(gate.open) }) }
	defer openGate()

	resp := h.post(key, "/v1/chat/completions", streamBody, with(with(run, fakellm.HeaderChunks, "10"), fakellm.HeaderDropAfter, "3"))
	defer resp.Body.Close()
	sawError := make(chan struct{})
	go func() {
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if strings.Contains(line, "upstream_broken") {
				close(sawError)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	<-gate.blocked
	select {
	case <-sawError:
		// The caller has the end of its answer while the call's tally is still held back.
	case <-time.After(2 * time.Second):
		// The error event waits for the tally, as it should: let the tally through.
		openGate()
		<-sawError
	}
	status, body := h.settleRun(key, "task-broken-end")
	openGate()
	if status != http.StatusOK {
		t.Fatalf("settle sent once the broken stream's error event arrived: %d %s, want 200", status, body)
	}
	r := h.run(u.ID, runID)
	if r.Calls != 2 || r.OutTok <= 5 {
		t.Fatalf("settled run %+v: want both calls charged (the first's 5 output tokens and the broken one's)", r)
	}
}
