package e2e

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSigtermWaitsForARunTallysRetries: SIGTERM while a named run's call, answered with Redis
// cut off, is still trying to write its tally. The tally is the Redis record a settlement
// reads beside the run's row, and the call's end goes on trying it in the background until
// settle_timeout (finishRunCall); the shutdown waits for those tries as for a settlement
// (proxy.Server.Drain), so a Redis back within settle_timeout gets the call. Here Redis stays
// cut: the process must still be trying when its drain of the calls is over, and exit once the
// tries give up, saying so. A process that did not wait for them exited with them unsaid.
// Money is not at stake here: the run's row records the call.
func TestSigtermWaitsForARunTallysRetries(t *testing.T) {
	w := newWorld(t)
	_, key := w.user("term-tally", 10, nil)
	relay := newFreezer(t, w.redisAddr())
	g := w.startGatewayWith("gw-term-tally", w.writeConfig(nil), "REDIS_URL=redis://"+relay.addr()+"/0")
	// Held after its first event, so that Redis is cut between the call's reservation and its end.
	held, letGo := w.holdStreams("term-tally", map[string]string{"X-Run-Id": "agent-tally"})
	s := startStream(t, g, key, 20, 10*time.Millisecond, held)
	relay.cut()
	letGo()
	<-s.done
	if s.chunks < 20 || s.err != nil {
		t.Fatalf("the run's call: client read %d events (err %v), want all 20", s.chunks, s.err)
	}
	logHas := func(line string) bool {
		b, err := os.ReadFile(g.log)
		return err == nil && strings.Contains(string(b), line)
	}
	// The first failed write says so; its retries go on in the background.
	waitFor(t, 10*time.Second, "the call's tally write to fail", func() bool {
		return logHas("run tally write failed; tried again until settle_timeout")
	})
	g.signal(t, syscall.SIGTERM)
	const settleTimeout = 10 * time.Second // the world's limits.settle_timeout
	// The wait's own deadline catches a hang; it does not measure the exit.
	if err := g.wait(t, testShutdownDrain+settleTimeout+5*time.Second+30*time.Second); err != nil {
		t.Errorf("gateway exit: %v, want status 0", err)
	}
	for _, line := range []string{"calls drained; waiting for their settlements", "run tally never written; the run's row records the call"} {
		if !logHas(line) {
			t.Errorf("the gateway's log after its exit lacks %q: it did not wait for the tally's tries", line)
		}
	}
	// The call is recorded on the run's row all the same, which is what settles the run.
	if rc, _, calls, _ := w.hold(s.runID).Recorded(); calls != 1 || w.price.Cost(rc) == 0 {
		t.Errorf("the run's row records %d calls (%+v), want the one call", calls, rc)
	}
}
