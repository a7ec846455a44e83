package holds_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// shapes records the writer's batches.
type shapes struct {
	mu  sync.Mutex
	all []holds.BatchShape
}

func (s *shapes) add(b holds.BatchShape) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, b)
}

func (s *shapes) list() []holds.BatchShape {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]holds.BatchShape(nil), s.all...)
}

// waitGathered waits until the writer holds n items in the batch it is forming.
func waitGathered(t *testing.T, w *holds.Writer, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for w.Gathered() != n {
		if time.Now().After(deadline) {
			t.Fatalf("writer gathered %d items, want %d", w.Gathered(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// storeWithUsers is a store on a fresh test database and n users of the standard plan, named
// prefix-<random>. When the test ends, the day ledger must agree with the holds.
func storeWithUsers(t *testing.T, prefix string, n int) (*sqlx.DB, *holds.Store, []holds.User) {
	t.Helper()
	db := testenv.MySQL(t)
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	users := make([]holds.User, n)
	for i := range users {
		u, err := st.CreateUser(context.Background(), prefix+"-"+testenv.RandomID(3), "standard")
		if err != nil {
			t.Fatal(err)
		}
		users[i] = u
	}
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	return db, st, users
}

type settleOutcome struct {
	res holds.Settled
	err error
}

// settleAsync offers st to w and returns where its outcome will arrive.
func settleAsync(w *holds.Writer, st holds.Settlement) chan settleOutcome {
	return settleAsyncWith(context.Background(), w, st)
}

// settleAsyncWith is settleAsync whose caller waits under ctx.
func settleAsyncWith(ctx context.Context, w *holds.Writer, st holds.Settlement) chan settleOutcome {
	out := make(chan settleOutcome, 1)
	go func() {
		res, err := w.Settle(ctx, st)
		out <- settleOutcome{res, err}
	}()
	return out
}

// TestWriterSettlementRidesWithNextAdmission: a settlement waiting for company commits in the
// same transaction as the next admission, which sees the credits it freed. The linger is far
// longer than the merge takes, so a writer that did not merge would leave the settlement waiting and
// refuse the admission for want of credits.
func TestWriterSettlementRidesWithNextAdmission(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	allowance := int64(20_000)
	if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	f.admit("r_ride_a") // holds all 20 credits
	var seen shapes
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 2, Linger: 5 * time.Second,
		AdmitTimeout: 10 * time.Second, SettleTimeout: 10 * time.Second, OnBatch: seen.add})
	defer w.Close()

	settled := settleAsync(w, holds.Settlement{RunID: "r_ride_a", UserID: f.user.ID, CostMicro: 5_000, Source: holds.SourceComplete})
	waitGathered(t, w, 1)
	h, err := w.Admit(ctx, holds.AdmitRequest{RunID: "r_ride_b", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
	if err != nil {
		t.Fatalf("admission after the settlement: %v", err)
	}
	if h.HeldMicro != 15_000 {
		t.Fatalf("held %d, want the 15,000 the settlement left", h.HeldMicro)
	}
	s := <-settled
	if s.err != nil || !s.res.Applied || s.res.ChargedMicro != 5_000 {
		t.Fatalf("settlement: %+v, %v", s.res, s.err)
	}
	if got := seen.list(); len(got) != 1 || got[0].Settlements != 1 || got[0].Admissions != 1 || got[0].Err != nil {
		t.Fatalf("batches %+v, want one of 1 settlement and 1 admission", got)
	}
	// The batch tells how long its transaction took and how long its admission queued for it
	// (the admit_tx and admit_queue phases of the gateway's metrics).
	if b := seen.list()[0]; b.Took <= 0 || len(b.AdmitWaits) != 1 || b.AdmitWaits[0] < 0 {
		t.Fatalf("batch took %v, admission waits %v: want a duration and one wait", b.Took, b.AdmitWaits)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_ride_b", Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestWriterCloseCommitsLingeringSettlements: Close does not wait out the linger (ten minutes
// here), and does not drop what was gathered.
func TestWriterCloseCommitsLingeringSettlements(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_close")
	w := holds.NewWriter(f.store, holds.WriterConfig{Linger: 10 * time.Minute, AdmitTimeout: 10 * time.Second, SettleTimeout: 20 * time.Minute})
	settled := settleAsync(w, holds.Settlement{RunID: "r_close", CostMicro: 3_000, Source: holds.SourceShutdown})
	waitGathered(t, w, 1)
	closed := make(chan struct{})
	go func() { w.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return")
	}
	if s := <-settled; s.err != nil || !s.res.Applied {
		t.Fatalf("lingering settlement at Close: %+v, %v", s.res, s.err)
	}
	if bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID); err != nil || bal.UsedTodayMicro != 3_000 || bal.InFlight != 0 {
		t.Fatalf("balance %+v, %v", bal, err)
	}
}

// TestWriterSettlementOutlivesAnAdmissionDeadline: a batch whose admission runs out of time
// (its user's row is held by another transaction) fails as a whole; its settlement, of
// another user, is committed again alone under its own deadline, and the admission leaves no
// hold.
func TestWriterSettlementOutlivesAnAdmissionDeadline(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_deadline_a")
	other, err := f.store.CreateUser(ctx, "deadline-b-"+strconv.FormatUint(f.user.ID, 10), "standard")
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockUserRow(t, f.store, other.ID)
	defer unlock()
	var seen shapes
	// The admission must be in a batch that starts before its deadline (a tenth of it left) to
	// fail with the batch: at 300 ms a worker descheduled for 270 ms on a loaded machine
	// answered it not started. At 2 s its batch still ends at its deadline, before the
	// session's lock wait (3 s, holds.Open) would.
	w := holds.NewWriter(f.store, holds.WriterConfig{Linger: 5 * time.Second, AdmitTimeout: 2 * time.Second,
		SettleTimeout: 10 * time.Second, OnBatch: seen.add})
	defer w.Close()
	settled := settleAsync(w, holds.Settlement{RunID: "r_deadline_a", UserID: f.user.ID, CostMicro: 4_000, Source: holds.SourceComplete})
	waitGathered(t, w, 1)
	_, err = w.Admit(ctx, holds.AdmitRequest{RunID: "r_deadline_b", UserID: other.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
	if err == nil || errors.Is(err, holds.ErrAdmitNotStarted) {
		t.Fatalf("admission behind a held lock past its deadline: %v, want the batch's failure", err)
	}
	// The failed batch's statement still waits on the server, holding the first user's lock,
	// until the lock it waits for is free (or its lock wait times out).
	unlock()
	if s := <-settled; s.err != nil || !s.res.Applied || s.res.ChargedMicro != 4_000 {
		t.Fatalf("settlement: %+v, %v", s.res, s.err)
	}
	got := seen.list()
	if len(got) != 2 || got[0].Admissions != 1 || got[0].Err == nil || got[1].Settlements != 1 || got[1].Admissions != 0 || got[1].Err != nil {
		t.Fatalf("batches %+v, want the failed mixed batch then the settlement alone", got)
	}
	if bal, err := f.store.Balance(ctx, other.ID); err != nil || bal.InFlight != 0 {
		t.Fatalf("balance %+v, %v: the failed admission must leave no hold", bal, err)
	}
}

// TestWriterAdmissionWaitIsBounded: with the only worker stuck in a settlement behind a held
// user lock, an admission of another user is not left waiting for it: after AdmitTimeout (or
// when its caller's context ends) it is refused as not started, and it is never started
// afterwards either: no hold appears once the worker is free again.
func TestWriterAdmissionWaitIsBounded(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	f.admit("r_stuck")
	other, err := f.store.CreateUser(ctx, "bounded-b-"+strconv.FormatUint(f.user.ID, 10), "standard")
	if err != nil {
		t.Fatal(err)
	}
	unlock := lockUserRow(t, f.store, f.user.ID)
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: 200 * time.Millisecond, SettleTimeout: 20 * time.Second})
	defer w.Close()
	stuck := settleAsync(w, holds.Settlement{RunID: "r_stuck", UserID: f.user.ID, CostMicro: 1_000, Source: holds.SourceComplete})
	waitLockWaiter(t, f.store)

	admit := func(ctx context.Context, run string) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := w.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: other.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
			done <- err
		}()
		return done
	}
	cctx, cancel := context.WithCancel(ctx)
	byTimeout, byCaller := admit(ctx, "r_waits_1"), admit(cctx, "r_waits_2")
	cancel()
	for name, done := range map[string]chan error{"AdmitTimeout": byTimeout, "caller's context": byCaller} {
		select {
		case err := <-done:
			if !errors.Is(err, holds.ErrAdmitNotStarted) {
				t.Errorf("admission ended by %s: %v, want ErrAdmitNotStarted", name, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("admission waited on the busy worker past its %s", name)
		}
	}
	unlock()
	if s := <-stuck; s.err != nil || !s.res.Applied {
		t.Fatalf("settlement after the lock was released: %+v, %v", s.res, s.err)
	}
	w.Close() // every gathered item has been handled
	if bal, err := f.store.Balance(ctx, other.ID); err != nil || bal.InFlight != 0 {
		t.Fatalf("balance %+v, %v: a withdrawn admission was started", bal, err)
	}
}

// waitLockWaiter waits until a statement of this test's database waits for a lock.
func waitLockWaiter(t *testing.T, st *holds.Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := st.DB().Get(&n, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE '%FOR UPDATE%'`); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no statement came to wait for the held lock")
		}
		time.Sleep(time.Millisecond)
	}
}

// lockUserRow holds a user's row lock in a transaction of its own until the returned
// function is called (it may be called more than once).
func lockUserRow(t *testing.T, st *holds.Store, userID uint64) func() {
	t.Helper()
	tx := testenv.ConsoleTx(t, st.DB())
	if _, err := tx.Exec("SELECT id FROM users WHERE id = ? FOR UPDATE", userID); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return func() { once.Do(func() { _ = tx.Rollback() }) }
}

// TestWriterStormOfAdmissionsAndSettlements: 8 users, 12 callers each, admit and settle
// through one writer until the balance is spent. Batches mix users, admissions and
// settlements; every user must end within the design's overdraft bound, every charge within
// its cap, nothing left held, and the ledger (checked at cleanup) equal to the charges.
func TestWriterStormOfAdmissionsAndSettlements(t *testing.T) {
	// The overdraft bound is one day's allowance's: past a midnight a fresh one pays on.
	f := newSettleFixtureMidday(t)
	ctx := context.Background()
	const users, callers = 8, 12
	allowance, inFlight := int64(200_000), 6
	ids := []uint64{f.user.ID}
	for i := 1; i < users; i++ {
		u, err := f.store.CreateUser(ctx, "storm-"+strconv.Itoa(i)+"-"+strconv.FormatUint(f.user.ID, 10), "standard")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, u.ID)
	}
	for _, id := range ids {
		if err := f.store.SetUserLimits(ctx, id, &allowance, &inFlight, nil); err != nil {
			t.Fatal(err)
		}
	}
	var seen shapes
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 4, MaxBatch: 32, Linger: 2 * time.Millisecond,
		AdmitTimeout: 10 * time.Second, SettleTimeout: 10 * time.Second, OnBatch: seen.add})
	defer w.Close()

	type charge struct{ held, cap, charged int64 }
	var mu sync.Mutex
	charges := map[uint64][]charge{}
	var wg sync.WaitGroup
	for ui, uid := range ids {
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(ui), uint64(c)))
				refusedInARow := 0
				for j := 0; refusedInARow < 20 && j < 500; j++ {
					run := "r_storm_" + strconv.Itoa(ui) + "_" + strconv.Itoa(c) + "_" + strconv.Itoa(j) + "_" + strconv.FormatUint(f.user.ID, 10)
					h, err := w.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: uid, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
					var busy *holds.TooManyInFlightError
					switch {
					case errors.As(err, &busy):
						continue
					case errors.Is(err, holds.ErrInsufficient):
						refusedInARow++
						continue
					case err != nil:
						t.Error(err)
						return
					}
					refusedInARow = 0
					res, err := w.Settle(ctx, holds.Settlement{RunID: run, UserID: uid, CostMicro: rng.Int64N(40_000), Source: holds.SourceComplete})
					if err != nil || !res.Applied {
						t.Errorf("settle %s: %+v, %v", run, res, err)
						return
					}
					mu.Lock()
					charges[uid] = append(charges[uid], charge{held: h.HeldMicro, cap: h.CapMicro, charged: res.ChargedMicro})
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	mixed := 0
	for _, b := range seen.list() {
		if b.Err != nil {
			t.Errorf("batch failed: %v", b.Err)
		}
		if b.Settlements > 0 && b.Admissions > 0 {
			mixed++
		}
	}
	if mixed == 0 {
		t.Errorf("no batch mixed settlements and admissions (%d batches)", len(seen.list()))
	}
	for _, uid := range ids {
		bal, err := testenv.BalanceAllDays(ctx, f.store, uid)
		if err != nil {
			t.Fatal(err)
		}
		var total, beyondHold int64
		for _, c := range charges[uid] {
			if c.charged > c.cap {
				t.Errorf("user %d: charged %d beyond the cap %d", uid, c.charged, c.cap)
			}
			total += c.charged
			beyondHold += max(0, c.charged-c.held)
		}
		if bal.InFlight != 0 || bal.HeldMicro != 0 || bal.UsedTodayMicro != total {
			t.Errorf("user %d: balance %+v, charges %d", uid, bal, total)
		}
		if over := bal.UsedTodayMicro - allowance; over > beyondHold {
			t.Errorf("user %d: %d over the allowance, beyond the bound %d", uid, over, beyondHold)
		}
		if bal.UsedTodayMicro < allowance-40_000 {
			t.Errorf("user %d: stopped at %d of %d: refused while credits were left", uid, bal.UsedTodayMicro, allowance)
		}
	}
}
