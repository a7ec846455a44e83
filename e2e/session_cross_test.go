package e2e

import (
	"bufio"
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// sessionStream is a session's streamed call held open by the test, whose last events are kept
// to see how it ended.
type sessionStream struct {
	runID  string
	done   chan struct{}
	chunks int    // content events read, valid after done
	last   string // the last data line, valid after done
}

// startSessionStream opens a long stream of session sid on g and returns once its first
// content event has arrived (the call is claimed, forwarding and registered on the cancel bus).
func startSessionStream(t *testing.T, g *gateway, key, sid string) *sessionStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp := post(t, ctx, g, key, chatBody(true, 5010, "tell me a long story"),
		map[string]string{"X-Session-Id": sid, "X-Fake-Chunks": "5000", "X-Fake-Chunk-Interval": "20ms"})
	if resp.StatusCode != 200 {
		resp.Body.Close()
		t.Fatalf("session stream on %s: %d", g.name, resp.StatusCode)
	}
	s := &sessionStream{runID: resp.Header.Get(RunIDHeaderForTests), done: make(chan struct{})}
	// true once the first content event has arrived; false if the stream ended without one.
	first := make(chan bool, 1)
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			s.last = line
			if strings.Contains(line, `"content":"tok`) {
				if s.chunks++; s.chunks == 1 {
					first <- true
				}
			}
		}
		if s.chunks == 0 {
			first <- false
		}
	}()
	select {
	case began := <-first:
		if !began {
			// Over before the test's next message or kill: the moment it names never came.
			<-s.done
			t.Fatalf("session stream %s on %s ended before its first event, last %q", s.runID, g.name, s.last)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no first event from %s within 15s", g.name)
	}
	return s
}

// TestSessionSupersededAcrossProcesses: a session's message streams on gw-a; its next message
// arrives at gw-b. gw-b's claim tells gw-a (cancel bus) to stop the old call: its caller's
// stream ends early with a superseded error event, and gw-a settles it once, as a cancel, at
// the estimate of what it had streamed (no usage report came); the new message runs on gw-b
// and is charged its reported usage. The day ledger is the two charges.
func TestSessionSupersededAcrossProcesses(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("session-cross", 10, nil)
	a := w.startGateway("gw-a")
	b := w.startGateway("gw-b")
	old := startSessionStream(t, a, key, "chat-1")
	newID, use := completeCall(t, b, key, chatBody(false, 40, "a different question"),
		map[string]string{"X-Session-Id": "chat-1", "X-Fake-Chunks": "30"})
	select {
	case <-old.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the superseded stream on gw-a still runs 10 s after the newer message was answered")
	}
	if !strings.Contains(old.last, `"superseded"`) || old.chunks >= 5000 {
		t.Errorf("old stream: %d chunks, last event %.200s; want cut short by a superseded error event", old.chunks, old.last)
	}
	waitFor(t, 10*time.Second, "both messages settled", func() bool { return w.liveHolds() == 0 })
	o := w.hold(old.runID)
	oldUse := pricing.Usage{Input: o.InTok, Output: o.OutTok}
	if o.SettleSource.String != holds.SourceCancel || !o.Estimated || o.OutTok < int64(old.chunks) || o.OutTok >= 5000 ||
		o.CostMicro != w.price.Cost(oldUse) || o.ChargedMicro != o.CostMicro || o.Calls != 1 {
		t.Errorf("old message: %q estimated %v calls %d in %d out %d cost %d charged %d; want settled once by cancel at the "+
			"estimate of its %d+ streamed chunks", o.SettleSource.String, o.Estimated, o.Calls, o.InTok, o.OutTok, o.CostMicro,
			o.ChargedMicro, old.chunks)
	}
	n := w.hold(newID)
	if n.SettleSource.String != holds.SourceComplete || n.ChargedMicro != w.price.Cost(use) || n.Estimated {
		t.Errorf("new message: %q charged %d estimated %v, want complete at %d", n.SettleSource.String, n.ChargedMicro, n.Estimated, w.price.Cost(use))
	}
	if got, want := w.ledgerUsed(u.ID), o.ChargedMicro+n.ChargedMicro; got != want {
		t.Errorf("day ledger %d, want the two charges %d", got, want)
	}
}

// TestSessionMessageOnAKilledProcessReplaced: gw-a is SIGKILLed while it streams a session's
// message; the next message goes to gw-b. Its claim replaces the dead run (the cancel reaches
// no one) and it runs and is charged its usage; the dead run, with no tally and no lease, is
// charged its hold once by the reconciler, never by the claim.
func TestSessionMessageOnAKilledProcessReplaced(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("session-kill", 10, nil)
	a := w.startGateway("gw-a")
	b := w.startGateway("gw-b")
	old := startSessionStream(t, a, key, "chat-2")
	a.signal(t, syscall.SIGKILL)
	<-old.done
	newID, use := completeCall(t, b, key, chatBody(false, 40, "are you there?"),
		map[string]string{"X-Session-Id": "chat-2", "X-Fake-Chunks": "30"})
	waitFor(t, 30*time.Second, "the dead message reconciled", func() bool { return w.liveHolds() == 0 })
	o := w.hold(old.runID)
	if o.SettleSource.String != holds.SourceReconcileHold || o.ChargedMicro != o.HeldMicro || !o.Estimated {
		t.Errorf("dead message: %q charged %d estimated %v, want reconcile_hold at its hold %d", o.SettleSource.String,
			o.ChargedMicro, o.Estimated, o.HeldMicro)
	}
	n := w.hold(newID)
	if n.SettleSource.String != holds.SourceComplete || n.ChargedMicro != w.price.Cost(use) {
		t.Errorf("new message: %q charged %d, want complete at %d", n.SettleSource.String, n.ChargedMicro, w.price.Cost(use))
	}
	if got, want := w.ledgerUsed(u.ID), o.ChargedMicro+n.ChargedMicro; got != want {
		t.Errorf("day ledger %d, want the two charges %d", got, want)
	}
}
