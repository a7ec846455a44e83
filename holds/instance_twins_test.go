package holds_test

import (
	"sync"
	"testing"
	"time"
)

// TestTwinsAreCountedWhileTheyLast: a process under the instance name of another live one is
// logged once (reportTwin); OnTwins is told, at each watch, how many such processes were seen
// to beat within their gap, so that the gateway's tollgate_instance_twins shows the condition
// for as long as it lasts: 0 alone, 1 while a twin beats (at every watch, however soon after
// the last), 0 again once it stops (killed, or stopped and retired), and never a process of
// another name.
func TestTwinsAreCountedWhileTheyLast(t *testing.T) {
	e := newStoreEnv(t)
	const interval = 50 * time.Millisecond
	self, err := e.store.RegisterInstance(e.ctx(), "gw-twin", interval, 0, e.log)
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
	twin, err := e.store.RegisterInstance(e.ctx(), "gw-twin", interval, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.store.RegisterInstance(e.ctx(), "gw-other", interval, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	beat := func() {
		t.Helper()
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
}

// TestTwinsReportedAreForgottenWithTheirRows: the twins already reported (each logged once)
// are remembered only while their rows are watched. A twin restarted again and again under
// the name registers a new row each time; remembered for good, each start grew the map for
// the life of this process.
func TestTwinsReportedAreForgottenWithTheirRows(t *testing.T) {
	e := newStoreEnv(t)
	const interval = 50 * time.Millisecond
	self, err := e.store.RegisterInstance(e.ctx(), "gw-restarting-twin", interval, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	for start := range 5 {
		twin, err := e.store.RegisterInstance(e.ctx(), "gw-restarting-twin", interval, 0, e.log)
		if err != nil {
			t.Fatal(err)
		}
		if err := self.Watch(e.ctx()); err != nil {
			t.Fatal(err)
		}
		if err := twin.Beat(e.ctx()); err != nil {
			t.Fatal(err)
		}
		if err := self.Watch(e.ctx()); err != nil {
			t.Fatal(err)
		}
		if n := self.TwinsReported(); n != 1 {
			t.Fatalf("start %d: %d twins remembered while one twin row beats, want 1", start, n)
		}
		if err := twin.Retire(e.ctx()); err != nil { // stopped: its row leaves the watch
			t.Fatal(err)
		}
	}
	if err := self.Watch(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if n := self.TwinsReported(); n != 0 {
		t.Fatalf("%d twins remembered after every twin's row was retired, want 0", n)
	}
}
