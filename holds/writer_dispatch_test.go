package holds_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestWriterLingerStartsAfreshForEachBatch: a batch of settlements alone lingers for an
// admission whatever the batch before it was: one that carried an admission, one that left on
// its linger, or one whose linger was cut short by an admission a while ago. Each of the
// rides below must be one batch of the settlement and the admission; the lone settlement
// leaves on its own once it has lingered.
func TestWriterLingerStartsAfreshForEachBatch(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	const linger = 2 * time.Second
	var seen shapes
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 2, Linger: linger,
		AdmitTimeout: 10 * time.Second, SettleTimeout: time.Minute, OnBatch: seen.add})
	defer w.Close()
	n := 0
	admit := func() string {
		t.Helper()
		n++
		run := fmt.Sprintf("r_afresh_%d", n)
		if _, err := w.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
			t.Fatalf("admit %s: %v", run, err)
		}
		return run
	}
	settle := func(run string) chan settleOutcome {
		return settleAsync(w, holds.Settlement{RunID: run, UserID: f.user.ID, CostMicro: 1_000, Source: holds.SourceComplete})
	}
	check := func(s chan settleOutcome) {
		t.Helper()
		if o := <-s; o.err != nil || !o.res.Applied {
			t.Fatalf("settlement: %+v, %v", o.res, o.err)
		}
	}
	ride := func(run string) string {
		t.Helper()
		s := settle(run)
		waitGathered(t, w, 1)
		next := admit()
		check(s)
		return next
	}
	run := admit()         // an admission alone
	run = ride(run)        // after a batch that carried an admission
	time.Sleep(2 * linger) // idle past the last ride's linger (a timer left running would fire now)
	run = ride(run)        // after a ride whose linger an admission cut short
	last := admit()
	check(settle(run)) // alone, leaves on its linger
	run = ride(last)   // after a batch that left on its linger
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	want := [][2]int{{0, 1}, {1, 1}, {1, 1}, {0, 1}, {1, 0}, {1, 1}}
	got := seen.list()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].Settlements == want[i][0] && got[i].Admissions == want[i][1]
	}
	if !ok {
		t.Fatalf("batches %+v; want (settlements, admissions) %v", got, want)
	}
}

// TestWriterLingerIsNotRestartedBySettlementsThatJoin: a batch of settlements alone leaves once
// its first settlement has lingered, however many join it meanwhile. A linger restarted by
// each settlement that joined never ended under a steady trickle of them (a busy upstream's
// call ends, and no admission to ride with), and every one of them waited for the trickle to
// stop. Here one joins every tenth of the linger, up to fifty times: the first must be
// answered while they are still coming.
func TestWriterLingerIsNotRestartedBySettlementsThatJoin(t *testing.T) {
	const linger, joins = time.Second, 50
	_, st, users := storeWithUsers(t, "linger", (joins+3)/3)
	ctx := context.Background()
	var runs []holds.Settlement
	for i, u := range users {
		for j := range 3 { // the plan's max_in_flight
			run := fmt.Sprintf("r_linger_%d_%d", i, j)
			if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, State: holds.StateRunning, TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			runs = append(runs, holds.Settlement{RunID: run, UserID: u.ID, CostMicro: 1_000, Source: holds.SourceComplete})
		}
	}
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 2, MaxBatch: 2 * joins, Linger: linger,
		AdmitTimeout: 10 * time.Second, SettleTimeout: time.Minute})
	defer w.Close()
	first := settleAsync(w, runs[0])
	waitGathered(t, w, 1)
	tick := time.NewTicker(linger / 10)
	defer tick.Stop()
	var outs []chan settleOutcome
	var o settleOutcome
	for answered := false; !answered; {
		select {
		case o = <-first:
			answered = true
		case <-tick.C:
			if len(outs) == joins {
				t.Fatalf("first settlement unanswered after %d joined it, one every %v: its linger (%v) restarts with each", joins, linger/10, linger)
			}
			outs = append(outs, settleAsync(w, runs[len(outs)+1]))
		}
	}
	if o.err != nil || !o.res.Applied {
		t.Fatalf("first settlement: %+v, %v", o.res, o.err)
	}
	for i, out := range outs {
		if o := <-out; o.err != nil || !o.res.Applied {
			t.Fatalf("settlement %d that joined: %+v, %v", i, o.res, o.err)
		}
	}
}

// TestWriterBatchesNoMoreThanMaxBatch: a batch never holds more than MaxBatch items (the
// store refuses more), and a full batch of settlements leaves as soon as a worker is free,
// without lingering (the linger here is ten minutes). The only worker is held by an admission
// on a locked row while three settlements queue behind it, MaxBatch 2.
func TestWriterBatchesNoMoreThanMaxBatch(t *testing.T) {
	_, st, users := storeWithUsers(t, "maxbatch", 2)
	a, b := users[0], users[1]
	ctx := context.Background()
	for i := range 3 {
		if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: fmt.Sprintf("r_maxbatch_%d", i), UserID: b.ID, State: holds.StateRunning, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	unlock := lockUserRow(t, st, a.ID)
	defer unlock()
	var seen shapes
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 1, MaxBatch: 2, Linger: 10 * time.Minute,
		AdmitTimeout: time.Minute, SettleTimeout: 20 * time.Minute, OnBatch: seen.add})
	defer w.Close()
	stalled := make(chan error, 1)
	go func() {
		_, err := w.Admit(ctx, holds.AdmitRequest{RunID: "r_maxbatch_stall", UserID: a.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		stalled <- err
	}()
	waitLockWaiter(t, st)
	var outs []chan settleOutcome
	for i := range 3 {
		outs = append(outs, settleAsync(w, holds.Settlement{RunID: fmt.Sprintf("r_maxbatch_%d", i), UserID: b.ID, CostMicro: 1_000, Source: holds.SourceComplete}))
		if i < 2 {
			waitGathered(t, w, i+1)
		}
	}
	unlock()
	if err := <-stalled; err != nil {
		t.Fatalf("the stalled admission: %v", err)
	}
	// Two of the three settlements fill a batch: they must not wait out the linger.
	full := 0
	deadline := time.After(time.Minute)
	for full < 2 {
		for i, o := range outs {
			select {
			case s := <-o:
				if s.err != nil || !s.res.Applied {
					t.Fatalf("settlement %d: %+v, %v", i, s.res, s.err)
				}
				outs[i] = nil
				full++
			default:
			}
		}
		select {
		case <-deadline:
			t.Fatalf("%d settlements answered a minute after the stall ended; a full batch of two (linger 10m) must leave at once", full)
		case <-time.After(time.Millisecond):
		}
	}
	// The third lingers; an admission takes it along.
	h, err := w.Admit(ctx, holds.AdmitRequest{RunID: "r_maxbatch_next", UserID: b.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		if o == nil {
			continue
		}
		if s := <-o; s.err != nil || !s.res.Applied {
			t.Fatalf("settlement %d: %+v, %v", i, s.res, s.err)
		}
	}
	for _, s := range seen.list() {
		if s.Settlements+s.Admissions > 2 {
			t.Fatalf("batches %+v; want none of more than MaxBatch 2 items", seen.list())
		}
	}
	for _, run := range []string{"r_maxbatch_stall", h.RunID} {
		if _, err := st.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWriterBatchDeadlines: a batch of settlements alone runs under SettleTimeout from when a
// worker took it, even when AdmitTimeout is shorter; a batch with an admission runs under the
// admission's own deadline, even when SettleTimeout is shorter: the settlement's time does not
// cut an admission's, nor the other way round.
func TestWriterBatchDeadlines(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_deadlines_a")
	var seen shapes
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: 5 * time.Second, SettleTimeout: time.Minute,
		OnBatch: seen.add})
	defer w.Close()
	before := time.Now()
	if _, err := w.Settle(ctx, holds.Settlement{RunID: "r_deadlines_a", UserID: f.user.ID, CostMicro: 1_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	got := seen.list()
	if len(got) != 1 || got[0].Settlements != 1 {
		t.Fatalf("batches %+v, want the settlement's", got)
	}
	if d := got[0].Deadline; d.Before(before.Add(time.Minute)) || d.After(after.Add(time.Minute)) {
		t.Fatalf("the settlement's batch ran under a deadline %v from its offer; want its SettleTimeout, 1m", d.Sub(before))
	}
	w.Close()

	var seen2 shapes
	w = holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: 10 * time.Minute, SettleTimeout: time.Minute,
		OnBatch: seen2.add})
	defer w.Close()
	deadline := time.Now().Add(5 * time.Minute)
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	h, err := w.Admit(actx, holds.AdmitRequest{RunID: "r_deadlines_b", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
	if err != nil {
		t.Fatal(err)
	}
	got = seen2.list()
	if len(got) != 1 || got[0].Admissions != 1 {
		t.Fatalf("batches %+v, want the admission's", got)
	}
	if !got[0].Deadline.Equal(deadline) {
		t.Fatalf("the admission's batch ran under a deadline %v from its caller's, want its caller's (5m, shorter than AdmitTimeout, longer than SettleTimeout)", got[0].Deadline.Sub(deadline))
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: h.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
