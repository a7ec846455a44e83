package holds_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
)

// TestTwinsAreCountedWhileTheyLast: a process under the instance name of another live one is
// logged once (reportTwin); OnTwins is told, at each watch, how many such processes were seen
// to beat within their gap, so that the gateway's tollgate_instance_twins shows the condition
// for as long as it lasts: 0 alone, 1 while a twin beats (at every watch, however soon after
// the last), 0 again once it stops (killed, or stopped and retired), and never a process of
// another name.
func TestTwinsAreCountedWhileTheyLast(t *testing.T) {
	// The name column holds 255 characters: a longer name is cut to fit, and its twins are
	// the rows under the name as cut.
	for _, name := range []string{"gw-twin", strings.Repeat("gw-twin-é", 40)} {
		t.Run(fmt.Sprintf("%d characters", utf8.RuneCountInString(name)), func(t *testing.T) { twinsCountedWhileTheyLast(t, name) })
	}
}

func twinsCountedWhileTheyLast(t *testing.T, name string) {
	e := newStoreEnv(t)
	const interval = 50 * time.Millisecond
	core, logs := observer.New(zap.ErrorLevel)
	self, err := e.store.RegisterInstance(e.ctx(), name, interval, 0, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var told []int
	self.OnTwins(func(n int) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, n)
	})
	last := func() int {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(told) == 0 {
			t.Fatal("OnTwins not told after a watch")
		}
		return told[len(told)-1]
	}
	watch := func() {
		t.Helper()
		if err := self.Watch(e.ctx()); err != nil {
			t.Fatal(err)
		}
	}
	twin, err := e.store.RegisterInstance(e.ctx(), name, interval, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.store.RegisterInstance(e.ctx(), "gw-other", interval, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	beat := func() { // self beats too: its own row is not a twin of itself
		t.Helper()
		if err := self.Beat(e.ctx()); err != nil {
			t.Fatal(err)
		}
		if err := twin.Beat(e.ctx()); err != nil {
			t.Fatal(err)
		}
		if err := other.Beat(e.ctx()); err != nil {
			t.Fatal(err)
		}
	}
	watch() // the first reading of the other rows: no beat seen to move yet
	if n := last(); n != 0 {
		t.Fatalf("twins %d before any beat was seen to move, want 0", n)
	}
	beat()
	watch()
	if n := last(); n != 1 {
		t.Fatalf("twins %d with a live process under the same name (and one under another), want 1", n)
	}
	beat()
	watch()
	if n := last(); n != 1 {
		t.Fatalf("twins %d while the twin goes on beating, want 1 (it is counted at every watch, not once)", n)
	}
	// A reconcile pass watches right after the heartbeat's watch, before the twin beats again:
	// the twin still lives, and a gauge that fell to 0 at every such watch would never hold
	// for an alert's "for" window.
	watch()
	if n := last(); n != 1 {
		t.Fatalf("twins %d at a watch right after the last one, before the twin's next beat, want 1", n)
	}
	// The twin stops (killed): its beat stands still, and once its own gap (max_gap_us: the
	// longest a live process's beat may stand still) has passed it is no longer counted.
	if err := other.Beat(e.ctx()); err != nil {
		t.Fatal(err)
	}
	self.SkewWatch(twin.Gap() + time.Millisecond)
	watch()
	if n := last(); n != 0 {
		t.Fatalf("twins %d once the twin stopped beating for longer than its gap, want 0", n)
	}
	if n := logs.FilterMessageSnippet("another live gateway process").Len(); n != 1 {
		t.Errorf("the twin logged %d times over the watches that counted it, want once", n)
	}
}

// TestHeartbeatCountsTwins: Run watches after each beat, and each watch tells OnTwins, so
// tollgate_instance_twins shows a twin on a process whose reconcile passes do not run (another
// process holds the reconcile lock, or reconcile_interval is 0).
func TestHeartbeatCountsTwins(t *testing.T) {
	e := newStoreEnv(t)
	const interval = 20 * time.Millisecond
	run := func(in *holds.Instance) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); in.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	register := func() *holds.Instance {
		t.Helper()
		in, err := e.store.RegisterInstance(e.ctx(), "gw-beating-twins", interval, 0, e.log)
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	self, twin := register(), register()
	told := make(chan int, 1)
	self.OnTwins(func(n int) {
		if n > 0 {
			select {
			case told <- n:
			default:
			}
		}
	})
	run(self)
	run(twin)
	select {
	case n := <-told:
		if n != 1 {
			t.Errorf("heartbeat counted %d twins, want 1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no twin counted by 10 s of heartbeats every 20 ms with a twin beating")
	}
}
