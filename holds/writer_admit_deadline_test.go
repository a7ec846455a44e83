package holds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWriterAdmissionWaitsNoLongerThanItsAdmitTimeout: an admission waits for the batch
// writer and then for its batch's transaction, and admit_timeout bounds the two together.
// The batch's transaction used to get admit_timeout of its own, counted from when a worker
// took it: an admission that had queued behind a stalled batch for most of its admit_timeout
// then waited a whole admit_timeout more for a batch the database kept waiting, close to
// twice what its caller was promised. Here the only worker is held by a settlement on a
// locked user row while two admissions gather, the first a quarter of admit_timeout before
// the worker frees; their batch then waits on another locked row. The batch must run under
// the earlier admission's own deadline (a structural bound, whatever the machine's load:
// that admission's deadline was set before the test saw it gathered), and both are refused
// with nothing held, not told their outcome is unknown.
func TestWriterAdmissionWaitsNoLongerThanItsAdmitTimeout(t *testing.T) {
	db, st, users := storeWithUsers(t, "deadline", 3)
	ctx := context.Background()
	a, b, c := users[0], users[1], users[2]
	if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: "r_deadline_stalled", UserID: a.ID, State: holds.StateRunning, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	consoleA, consoleB := testenv.ConsoleTx(t, db), testenv.ConsoleTx(t, db)
	if _, err := consoleA.Exec("SELECT id FROM users WHERE id = ? FOR UPDATE", a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := consoleB.Exec("SELECT id FROM users WHERE id = ? FOR UPDATE", b.ID); err != nil {
		t.Fatal(err)
	}

	const admitTimeout = 4 * time.Second
	var seen shapes
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 1, AdmitTimeout: admitTimeout, SettleTimeout: time.Minute,
		OnBatch: seen.add})
	defer w.Close()
	stalled := settleAsync(w, holds.Settlement{RunID: "r_deadline_stalled", UserID: a.ID, CostMicro: 1_000, Source: holds.SourceComplete})
	obs, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	waitLockWaits(t, obs, 1) // the only worker waits on a's row

	type answer struct {
		err error
		at  time.Time
	}
	admit := func(run string, user uint64) chan answer {
		out := make(chan answer, 1)
		go func() {
			_, err := w.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: user, State: holds.StateRunning, TTL: time.Minute,
				Fresh: true, Token: testenv.RandomID(16)})
			out <- answer{err, time.Now()}
		}()
		return out
	}
	first := admit("r_deadline_first", b.ID)
	waitGathered(t, w, 1)
	// The first admission's deadline was set before now: it ends by firstBy.
	firstBy := time.Now().Add(admitTimeout)
	// It waits a quarter of its admit_timeout for the worker: any wait shows the fault, a
	// quarter leaves it three quarters, far more than a loaded machine needs to start its batch.
	time.Sleep(admitTimeout / 4)
	second := admit("r_deadline_second", c.ID)
	waitGathered(t, w, 2)
	if err := consoleA.Rollback(); err != nil {
		t.Fatal(err)
	}
	if s := <-stalled; s.err != nil || !s.res.Applied {
		t.Fatalf("the stalled settlement once its lock went: %+v, %v", s.res, s.err)
	}
	f, s := <-first, <-second
	for _, r := range []struct {
		name string
		a    answer
	}{{"first", f}, {"second", s}} {
		if r.a.err == nil || errors.Is(r.a.err, holds.ErrOutcomeUnknown) {
			t.Errorf("%s admission in a batch waiting on a locked row: %v; want refused, nothing held", r.name, r.a.err)
		}
	}
	if errors.Is(f.err, holds.ErrAdmitNotStarted) {
		t.Fatalf("the first admission was never started (%v): the machine took three quarters of admit_timeout to start a batch", f.err)
	}
	all := seen.list()
	var batch *holds.BatchShape
	for i := range all {
		if all[i].Admissions > 0 {
			batch = &all[i]
		}
	}
	if batch == nil || batch.Admissions != 2 {
		t.Fatalf("batches %+v; want one carrying both admissions", all)
	}
	if batch.Deadline.After(firstBy) {
		t.Errorf("the admissions' batch ran under a deadline %v past the first admission's own; it was answered %v after its admit_timeout began (admit_timeout %v)",
			batch.Deadline.Sub(firstBy), f.at.Sub(firstBy.Add(-admitTimeout)), admitTimeout)
	}
	t.Logf("first admission answered %v after its admit_timeout began (admit_timeout %v)", f.at.Sub(firstBy.Add(-admitTimeout)), admitTimeout)
	var held int
	if err := db.Get(&held, "SELECT COUNT(*) FROM run_holds WHERE run_id IN ('r_deadline_first', 'r_deadline_second')"); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("%d holds left by refused admissions", held)
	}
}
