package holds_test

import (
	"testing"
	"time"
)

// TestBeatStreakRestartsAfterAGap: only a process whose beats have reached the database
// without a gap for the whole dead-instance bound may declare another dead (BeatingFor). One
// whose last beat is overdue (the database was out of its reach, and maybe everyone's, so the
// other beats are as stale as its own) has no streak, and once it beats again its streak starts
// anew: counted from before the gap, it would declare the others dead the moment the database
// came back, before any of them could beat.
func TestBeatStreakRestartsAfterAGap(t *testing.T) {
	e := newStoreEnv(t)
	in, err := e.store.RegisterInstance(e.ctx(), "gapped", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	beat := func() {
		t.Helper()
		if err := in.Beat(e.ctx()); err != nil {
			t.Fatal(err)
		}
	}
	gap := in.Gap()
	for range 4 { // a streak of two gaps, each beat half a gap after the last
		in.SkewBeats(gap / 2)
		beat()
	}
	if got := in.BeatingFor(); got < 2*gap {
		t.Fatalf("beating for %v after four beats half a gap (%v) apart, want at least %v", got, gap, 2*gap)
	}
	in.SkewBeats(gap + time.Millisecond)
	if got := in.BeatingFor(); got != 0 {
		t.Errorf("beating for %v with the last beat overdue by more than its gap, want 0", got)
	}
	beat()
	if got := in.BeatingFor(); got >= gap {
		t.Errorf("beating for %v right after the first beat past a gap, want a new streak (well under the gap %v)", got, gap)
	}
}

// TestBeatStreakOutlivesOneMissedBeat: a beat that fails (the database slow for a moment, the
// beat cut at its timeout) is tried at the next interval; the streak and the row's allowed gap
// (max_gap_us, which other processes hold this one to) live through that. Shorter, a process
// beating every minute lost its streak at one slow beat, and was taken for still by the others.
func TestBeatStreakOutlivesOneMissedBeat(t *testing.T) {
	e := newStoreEnv(t)
	for _, interval := range []time.Duration{10 * time.Second, time.Minute} {
		in, err := e.store.RegisterInstance(e.ctx(), "slow-beats", interval, 0, e.log)
		if err != nil {
			t.Fatal(err)
		}
		// The beat at the next tick failed at its 5 s timeout; the one after it comes at the
		// tick after, a little late.
		late := 2*interval + 4*time.Second
		in.SkewBeats(late)
		if got := in.BeatingFor(); got < late {
			t.Errorf("every %v: beating for %v %v after the last beat (one beat missed), want at least that", interval, got, late)
		}
		if err := in.Beat(e.ctx()); err != nil {
			t.Fatal(err)
		}
		if got := in.BeatingFor(); got < late {
			t.Errorf("every %v: beating for %v after the beat that followed a missed one, want the streak kept (at least %v)", interval, got, late)
		}
		var maxGap time.Duration
		if err := e.db.GetContext(e.ctx(), &maxGap, "SELECT max_gap_us * 1000 FROM instances WHERE id = ?", in.ID()); err != nil {
			t.Fatal(err)
		}
		if maxGap < late {
			t.Errorf("every %v: the row allows its beat to stand still %v, want at least %v (one beat missed)", interval, maxGap, late)
		}
	}
}
