package holds_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// poisonBatch queues, behind a batch stalled on a user's row lock, one batch of a good
// settlement and a good admission of user a, and a settlement and an admission of user b that
// poison makes into items the batch fails for. It returns the scene and the four outcomes, in
// that order, once the stall ends.
func poisonBatch(t *testing.T, poison func(*holds.Settlement, *holds.AdmitRequest)) (e *poisonEnv, good settleOutcome, goodAdmit error, bad settleOutcome, badAdmit error) {
	t.Helper()
	_, st, users := storeWithUsers(t, "poison", 3)
	e = &poisonEnv{store: st, a: users[0], b: users[1]}
	ctx := context.Background()
	for _, r := range []struct {
		u   holds.User
		run string
	}{{e.a, "r_poison_a_prev"}, {e.b, "r_poison_b_prev"}, {e.b, "r_poison_b_taken"}} {
		if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: r.run, UserID: r.u.ID, State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 1, AdmitTimeout: poisonAdmitTimeout, SettleTimeout: 10 * time.Second,
		OnBatch: e.seen.add})
	t.Cleanup(w.Close)
	// The stall: the only worker waits for users[2]'s row lock while the poisoned batch gathers.
	unlock := lockUserRow(t, st, users[2].ID)
	defer unlock()
	stalled := make(chan error, 1)
	go func() {
		_, err := w.Admit(ctx, holds.AdmitRequest{RunID: "r_poison_stall", UserID: users[2].ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		stalled <- err
	}()
	waitLockWaiter(t, st)
	goodSettled := settleAsync(w, holds.Settlement{RunID: "r_poison_a_prev", UserID: e.a.ID, CostMicro: 5_000, Calls: 1, Source: holds.SourceComplete})
	waitGathered(t, w, 1)
	badSt := holds.Settlement{RunID: "r_poison_b_prev", UserID: e.b.ID, CostMicro: 3_000, Calls: 1, Source: holds.SourceComplete}
	badReq := holds.AdmitRequest{RunID: "r_poison_b_new", UserID: e.b.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}
	poison(&badSt, &badReq)
	badSettled := settleAsync(w, badSt)
	waitGathered(t, w, 2)
	admitted := make(chan error, 2)
	go func() {
		_, err := w.Admit(ctx, holds.AdmitRequest{RunID: "r_poison_a_new", UserID: e.a.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		admitted <- err
	}()
	waitGathered(t, w, 3)
	go func() {
		_, err := w.Admit(ctx, badReq)
		admitted <- err
	}()
	waitGathered(t, w, 4)
	e.unlocked = time.Now() // every admission was offered before: its deadline is before unlocked+admitTimeout
	unlock()
	if err := <-stalled; err != nil {
		t.Fatalf("the stalled admission: %v", err)
	}
	good, bad = <-goodSettled, <-badSettled
	// The admissions answer in either order: tell them apart by what they say.
	first, second := <-admitted, <-admitted
	goodAdmit, badAdmit = first, second
	if first != nil && second == nil {
		goodAdmit, badAdmit = second, first
	}
	return e, good, goodAdmit, bad, badAdmit
}

type poisonEnv struct {
	store *holds.Store
	a, b  holds.User
	seen  shapes
	// unlocked is when the stall ended, after every admission was offered.
	unlocked time.Time
}

// poisonAdmitTimeout is the writer's AdmitTimeout in poisonBatch.
const poisonAdmitTimeout = 10 * time.Second

// TestWriterPoisonItemFailsOnlyItself: one settlement and one admission the database refuses
// for what they are share a batch with another user's settlement and admission. The batch
// fails as a whole; the writer must not fail the others with it (nor leave their holds to the
// reconciler and their callers to a 503), but commit them without the poisoned items, and
// answer those each its own error.
func TestWriterPoisonItemFailsOnlyItself(t *testing.T) {
	// A calls count past the INT column (1264), a fresh run id that exists (1062).
	e, good, goodAdmit, bad, badAdmit := poisonBatch(t, func(st *holds.Settlement, req *holds.AdmitRequest) {
		st.Calls = 1 << 40
		req.RunID = "r_poison_b_taken"
	})
	ctx := context.Background()
	if good.err != nil || !good.res.Applied || good.res.ChargedMicro != 5_000 {
		t.Errorf("the good settlement sharing a batch with poisoned items: %+v, %v; want applied, 5,000 charged", good.res, good.err)
	}
	if goodAdmit != nil {
		t.Errorf("the good admission sharing a batch with poisoned items: %v", goodAdmit)
	}
	if bad.err == nil {
		t.Errorf("the poisoned settlement: %+v; want its error", bad.res)
	}
	if badAdmit == nil || holds.IsUnavailable(badAdmit) || errors.Is(badAdmit, holds.ErrOutcomeUnknown) {
		t.Errorf("the poisoned admission: %v; want its own error, neither an outage nor an unknown outcome", badAdmit)
	}
	// Each part of the refused batch that carries an admission runs under the earliest of its
	// admissions' deadlines, not under the settlements' time counted from the refusal.
	for _, b := range e.seen.list() {
		if by := e.unlocked.Add(poisonAdmitTimeout); b.Admissions > 0 && b.Deadline.After(by) {
			t.Errorf("a batch of %d admissions ran under a deadline %v past its admissions' latest possible one", b.Admissions, b.Deadline.Sub(by))
		}
	}
	if r, err := e.store.Run(ctx, e.a.ID, "r_poison_a_prev"); err != nil || r.State != holds.StateSettled {
		t.Errorf("the good settlement's run: %+v, %v; want settled", r, err)
	}
	if r, err := e.store.Run(ctx, e.b.ID, "r_poison_b_prev"); err != nil || r.State != holds.StateRunning {
		t.Errorf("the poisoned settlement's run: %+v, %v; want still running (nothing of it written)", r, err)
	}
	for _, r := range []struct {
		u   holds.User
		run string
	}{{e.a, "r_poison_a_new"}, {e.b, "r_poison_b_prev"}, {e.b, "r_poison_b_taken"}, {e.a, "r_poison_a_prev"}} {
		if _, err := e.store.Settle(ctx, holds.Settlement{RunID: r.run, UserID: r.u.ID, Source: holds.SourceRelease}); err != nil && !errors.Is(err, holds.ErrRunNotFound) {
			t.Fatal(err)
		}
	}
}

// TestWriterPanickingItemFailsOnlyItself: building a batch panics for one item's sake (here
// the store's own check of a model name past MaxModelLen, which callers are to refuse first).
// The panic ran on the writer's worker and took the whole process down, every call in flight
// with it; it must fail only the item at fault, as a refusal by the database does.
func TestWriterPanickingItemFailsOnlyItself(t *testing.T) {
	e, good, goodAdmit, bad, badAdmit := poisonBatch(t, func(_ *holds.Settlement, req *holds.AdmitRequest) {
		req.Model = strings.Repeat("m", holds.MaxModelLen+1)
	})
	ctx := context.Background()
	if good.err != nil || !good.res.Applied || good.res.ChargedMicro != 5_000 {
		t.Errorf("the good settlement sharing a batch with a panicking item: %+v, %v; want applied, 5,000 charged", good.res, good.err)
	}
	if bad.err != nil || !bad.res.Applied || bad.res.ChargedMicro != 3_000 {
		t.Errorf("the other good settlement: %+v, %v; want applied, 3,000 charged", bad.res, bad.err)
	}
	if goodAdmit != nil {
		t.Errorf("the good admission sharing a batch with a panicking item: %v", goodAdmit)
	}
	if badAdmit == nil || holds.IsUnavailable(badAdmit) || errors.Is(badAdmit, holds.ErrOutcomeUnknown) {
		t.Errorf("the panicking admission: %v; want its own error, neither an outage nor an unknown outcome", badAdmit)
	}
	if _, err := e.store.Run(ctx, e.b.ID, "r_poison_b_new"); !errors.Is(err, holds.ErrRunNotFound) {
		t.Errorf("the panicking admission left a hold: %v", err)
	}
	for _, r := range []struct {
		u   holds.User
		run string
	}{{e.a, "r_poison_a_new"}, {e.b, "r_poison_b_taken"}} {
		if _, err := e.store.Settle(ctx, holds.Settlement{RunID: r.run, UserID: r.u.ID, Source: holds.SourceRelease}); err != nil {
			t.Fatal(err)
		}
	}
}
