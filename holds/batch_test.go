package holds_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestSettleBatchDecidesEachRunInTurn(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	// 30 credits of allowance and 100 prepaid: three charges of 20 cross into prepaid on the
	// second, and the split must follow batch order.
	allowance, inFlight := int64(30_000), 10
	if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, &inFlight, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.store.Grant(ctx, holds.GrantRequest{UserID: f.user.ID, AmountMicro: 100_000, IdempotencyKey: "topup-" + testenv.RandomID(4)}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"r_b1", "r_b2", "r_b3", "r_done"} {
		f.admit(id)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_done", CostMicro: 1, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	st := func(id string, cost int64) holds.Settlement {
		return holds.Settlement{RunID: id, CostMicro: cost, Source: holds.SourceComplete}
	}
	res, err := f.store.SettleBatch(ctx, []holds.Settlement{
		st("r_b1", 20_000), st("r_b2", 20_000), st("r_b1", 99_000), st("r_nope", 5), st("r_done", 7), st("r_b3", 20_000),
	})
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		applied           bool
		allowance, prepay int64
		notFound          bool
	}
	// r_done was charged 1 µUSD of allowance before the batch: 29,999 left.
	for i, w := range []want{
		{applied: true, allowance: 20_000},
		{applied: true, allowance: 9_999, prepay: 10_001},
		{}, // r_b1 again: already settled earlier in this batch
		{notFound: true},
		{}, // r_done: settled before the batch
		{applied: true, prepay: 20_000},
	} {
		r := res[i]
		if w.notFound != errors.Is(r.Err, holds.ErrRunNotFound) || r.Applied != w.applied ||
			r.AllowancePart != w.allowance || r.PrepaidPart != w.prepay {
			t.Errorf("result %d = %+v, want %+v", i, r, w)
		}
	}
	b, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID)
	if err != nil || b.UsedTodayMicro != 60_001 || b.PrepaidMicro != 100_000-30_001 || b.HeldMicro != 0 {
		t.Fatalf("balance %+v, %v", b, err)
	}
}

// TestConcurrentBatchesOverUsersDoNotDeadlock runs overlapping batches with no retries
// allowed: users are locked in id order, so batches only ever wait, never deadlock.
func TestConcurrentBatchesOverUsersDoNotDeadlock(t *testing.T) {
	db := testenv.MySQL(t)
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 0, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	ctx := context.Background()
	const users, perUser = 30, 3
	var all []holds.Settlement
	for i := 0; i < users; i++ {
		u, err := st.CreateUser(ctx, "batch-"+strconv.Itoa(i), "standard")
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < perUser; j++ {
			id := "r_cb_" + strconv.Itoa(i) + "_" + strconv.Itoa(j)
			if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: id, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
				t.Fatal(err)
			}
			all = append(all, holds.Settlement{RunID: id, UserID: u.ID, CostMicro: 1_000, Source: holds.SourceComplete})
		}
	}
	// Eight batchers, each settling every run in its own random order, in batches of 15:
	// every run is settled eight times over, once for real.
	var wg sync.WaitGroup
	var mu sync.Mutex
	applied := map[string]int{}
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			mine := append([]holds.Settlement(nil), all...)
			r := rand.New(rand.NewPCG(seed, seed))
			r.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
			for start := 0; start < len(mine); start += 15 {
				batch := mine[start:min(start+15, len(mine))]
				res, err := st.SettleBatch(ctx, batch)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for i, r := range res {
					if r.Applied {
						applied[batch[i].RunID]++
					}
				}
				mu.Unlock()
			}
		}(uint64(w + 1))
	}
	wg.Wait()
	if len(applied) != len(all) {
		t.Fatalf("%d runs applied, want %d", len(applied), len(all))
	}
	for id, n := range applied {
		if n != 1 {
			t.Fatalf("run %s applied %d times", id, n)
		}
	}
}

// TestWriterGroupsConcurrentSettlements: many goroutines settle through one Writer; every
// run is charged once, duplicates offered in the same moment change nothing, and nothing is
// taken after Close.
func TestWriterGroupsConcurrentSettlements(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	inFlight := 200
	f.setMaxInFlight(inFlight)
	const runs = 80
	for i := 0; i < runs; i++ {
		f.admit("r_s_" + strconv.Itoa(i))
	}
	b := holds.NewWriter(f.store, holds.WriterConfig{Workers: 2, MaxBatch: 16, Linger: time.Millisecond,
		AdmitTimeout: 10 * time.Second, SettleTimeout: 10 * time.Second})
	var wg sync.WaitGroup
	var mu sync.Mutex
	applied := 0
	for i := 0; i < runs*2; i++ { // every run offered twice
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := b.Settle(ctx, holds.Settlement{RunID: "r_s_" + strconv.Itoa(i%runs), CostMicro: 100, Source: holds.SourceComplete})
			if err != nil {
				t.Error(err)
				return
			}
			if res.Applied {
				mu.Lock()
				applied++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	b.Close()
	if applied != runs {
		t.Fatalf("%d settlements applied, want %d", applied, runs)
	}
	if _, err := b.Settle(ctx, holds.Settlement{RunID: "r_s_0", Source: holds.SourceComplete}); !errors.Is(err, holds.ErrBatcherClosed) {
		t.Fatalf("settle after close: %v", err)
	}
	bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID)
	if err != nil || bal.UsedTodayMicro != runs*100 || bal.HeldMicro != 0 {
		t.Fatalf("balance %+v, %v", bal, err)
	}
}

// TestWriterKeepsLimitsAcrossABatch: 60 concurrent admissions of one user arrive in
// batches; within a batch the running totals must refuse exactly as separate transactions
// would: never more than max_in_flight holds, never more held than available.
func TestWriterKeepsLimitsAcrossABatch(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	allowance, inFlight := int64(50_000), 5
	if err := f.store.SetUserLimits(ctx, f.user.ID, &allowance, &inFlight, nil); err != nil {
		t.Fatal(err)
	}
	a := holds.NewWriter(f.store, holds.WriterConfig{Workers: 2, MaxBatch: 32, AdmitTimeout: 10 * time.Second, SettleTimeout: 10 * time.Second})
	defer a.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var admitted []holds.Hold
	refused := map[string]int{}
	for i := 0; i < 60; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := a.Admit(ctx, holds.AdmitRequest{RunID: "r_adm_" + strconv.Itoa(i), UserID: f.user.ID,
				State: holds.StateRunning, TTL: time.Minute, Fresh: true})
			mu.Lock()
			defer mu.Unlock()
			var busy *holds.TooManyInFlightError
			switch {
			case err == nil:
				admitted = append(admitted, h)
			case errors.As(err, &busy):
				refused["in_flight"]++
			case errors.Is(err, holds.ErrInsufficient):
				refused["insufficient"]++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	var held int64
	for _, h := range admitted {
		held += h.HeldMicro
	}
	// 50 credits with holds of 20: 20 + 20 + 10, then nothing available.
	if len(admitted) != 3 || held != 50_000 || refused["insufficient"]+refused["in_flight"] != 57 {
		t.Fatalf("admitted %d holding %d, refused %v", len(admitted), held, refused)
	}
	for _, h := range admitted {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: h.RunID, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestUsersByKeysAnswersEachKey(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	good, err := f.store.CreateKey(ctx, f.user.ID)
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := f.store.CreateKey(ctx, f.user.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.RevokeKey(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	res, err := f.store.UsersByKeys(ctx, []string{good, revoked, "not-a-key", holds.KeyPrefix + "unknown", good})
	if err != nil {
		t.Fatal(err)
	}
	for i, wantOK := range []bool{true, false, false, false, true} {
		if ok := res[i].Err == nil && res[i].User.ID == f.user.ID; ok != wantOK {
			t.Errorf("key %d: %+v, want ok=%v", i, res[i], wantOK)
		}
		if !wantOK && !errors.Is(res[i].Err, holds.ErrBadKey) {
			t.Errorf("key %d: error %v, want ErrBadKey", i, res[i].Err)
		}
	}
}

// TestFailedBatchLeavesNoOpenTransaction: a batch whose lock wait times out must not hand its
// connection back to the pool inside the transaction it began, or the next autocommit write
// on that connection would silently never commit. The store has one connection, so the write
// after the failure is sure to run on the failed batch's connection.
func TestFailedBatchLeavesNoOpenTransaction(t *testing.T) {
	ctx := context.Background()
	dsn := shortLockWaitDSN(t)
	db, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 0, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	u, err := st.CreateUser(ctx, "open-tx", "standard")
	if err != nil {
		t.Fatal(err)
	}

	other, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	blocker := testenv.ConsoleTx(t, other)
	if _, err := blocker.ExecContext(ctx, "SELECT id FROM users WHERE id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	_, err = st.Admit(ctx, holds.AdmitRequest{RunID: "r_blocked", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
	if err == nil {
		t.Fatal("admission behind a held user lock succeeded")
	}
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}

	if _, err := db.ExecContext(ctx, "UPDATE users SET name = 'renamed' WHERE id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	var name string
	if err := other.GetContext(ctx, &name, "SELECT name FROM users WHERE id = ?", u.ID); err != nil || name != "renamed" {
		t.Fatalf("a write after the failed batch is not committed (name %q, %v): its connection was left in a transaction", name, err)
	}
	var holdsLeft int
	if err := other.GetContext(ctx, &holdsLeft, "SELECT COUNT(*) FROM run_holds"); err != nil || holdsLeft != 0 {
		t.Fatalf("%d holds after a failed admission, %v", holdsLeft, err)
	}
}

// TestAdmissionSeesPrepaidSpentBySettlementEarlierInItsBatch: a caller's call settles and its
// next call is admitted in one batch transaction (the writer's group commit: "a caller's next
// call pays for its previous call's settlement"). On an account living on prepaid credits the
// settlement takes its charge from prepaid_micro; the admission after it must see what is left,
// as it would in a transaction of its own. Seeing the credits of before the charge, it held and
// capped the next call against money already spent: that call could then take the account into
// debt by more than DESIGN §3's Σ (cap − hold) of its own row.
func TestAdmissionSeesPrepaidSpentBySettlementEarlierInItsBatch(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	zero := int64(0)
	if err := f.store.SetUserLimits(ctx, f.user.ID, &zero, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.store.Grant(ctx, holds.GrantRequest{UserID: f.user.ID, AmountMicro: 30_000, IdempotencyKey: "topup-" + testenv.RandomID(4)}); err != nil {
		t.Fatal(err)
	}
	first := f.admit("r_pays_first")
	if first.HeldMicro != 20_000 || first.CapMicro != 30_000 {
		t.Fatalf("first hold %+v: want 20 000 held of a 30 000 cap", first)
	}
	settled, admitted, err := f.store.WriteBatch(ctx,
		[]holds.Settlement{{RunID: "r_pays_first", CostMicro: 25_000, Calls: 1, Source: holds.SourceComplete}},
		[]holds.AdmitRequest{{RunID: "r_next_call", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}})
	if err != nil {
		t.Fatal(err)
	}
	if s := settled[0]; s.Err != nil || !s.Applied || s.PrepaidPart != 25_000 {
		t.Fatalf("settlement %+v: want 25 000 taken from prepaid", s)
	}
	// 30 000 − 25 000 = 5 000 left: the next hold, and its cap, are what is left.
	if a := admitted[0]; a.Err != nil || a.Hold.HeldMicro != 5_000 || a.Hold.CapMicro != 5_000 {
		t.Fatalf("admission after the settlement in its batch: %+v, %v; want 5 000 held of a 5 000 cap (what is left)", a.Hold, a.Err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_next_call", CostMicro: 5_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	if b, err := f.store.Balance(ctx, f.user.ID); err != nil || b.PrepaidMicro != 0 {
		t.Fatalf("balance %+v, %v: want prepaid spent to 0, no debt", b, err)
	}
}

// TestFirstCallsOfANewRunInOneBatchTakeOneHold: an agent's first turn is a burst of parallel
// tool calls under one new X-Run-Id, and the writer puts their admissions in one batch
// transaction (with another user's admission beside them). The first takes the run's hold;
// the others find it earlier in the batch and share it, as they would in transactions of
// their own. Each inserting a hold of its own, the batch hit the run's primary key and failed
// whole: every caller in it, the other user's too, was refused.
func TestFirstCallsOfANewRunInOneBatchTakeOneHold(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	other, err := f.store.CreateUser(ctx, "burst-neighbour-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	call := func(token string) holds.AdmitRequest {
		return holds.AdmitRequest{RunID: "x_first_burst", UserID: f.user.ID, ClientRunID: "first-burst", Model: "fake-gpt",
			State: holds.StateRunning, TTL: time.Hour, Token: token}
	}
	out, err := f.store.AdmitBatch(ctx, []holds.AdmitRequest{
		call("00000000000000000000000000000001"),
		{RunID: "r_neighbour", UserID: other.ID, State: holds.StateRunning, TTL: time.Hour, Fresh: true},
		call("00000000000000000000000000000002"),
		call("00000000000000000000000000000003"),
	})
	if err != nil {
		t.Fatalf("batch of a new run's first calls: %v", err)
	}
	for i, a := range out {
		if a.Err != nil || a.Hold.Existing != (i >= 2) {
			t.Errorf("admission %d: %+v, %v; want the run's first call to take its hold and the later ones to share it", i, a.Hold, a.Err)
		}
	}
	b, err := f.store.Balance(ctx, f.user.ID)
	if err != nil || b.InFlight != 1 || b.HeldMicro != out[0].Hold.HeldMicro {
		t.Fatalf("balance %+v, %v: want the run's one hold", b, err)
	}
	for _, id := range []string{"x_first_burst", "r_neighbour"} {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// shortLockWaitDSN is the test database's DSN with a lock wait of one second, so that a test
// can make a batch's lock wait time out without waiting the gateway's three.
func shortLockWaitDSN(t *testing.T) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"innodb_lock_wait_timeout": "1"}
	return cfg.FormatDSN()
}
