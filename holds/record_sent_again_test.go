package holds_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestRecordRunCallSentAgainIsCountedOnce: a call's record on its run's row that failed —
// its reply lost after it landed, or its network down before a byte was written, on a pooled
// connection or a new one — sent again with the same call id is counted once either way, and
// a record sent again after it landed and was answered adds nothing either. Before run_calls a
// record whose reply was lost was never sent again (sent, it counted the call twice), so a
// Redis restart before the run settled took the call from the run's charge; the first step
// below, a lost reply sent again, counted 2 calls.
func TestRecordRunCallSentAgainIsCountedOnce(t *testing.T) {
	f, lossy, dsn := newLossyFixtureDSN(t)
	t.Cleanup(lossy.Restore) // before the fixture's ledger check, if the test stops with it down
	ctx := context.Background()
	runID := "x_rec_again_" + testenv.RandomID(6)
	admitNamed(t, f.store, f.user, runID)
	plain := plainDB(t, dsn)
	record := func(callID string) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return f.store.RecordRunCall(rctx, runID, callID, time.Minute, pricing.Usage{Input: 10, Output: 2}, 90, 1, false)
	}
	want := func(step string, calls int) {
		t.Helper()
		r := recordedCalls(t, plain, runID)
		if r.calls != calls || r.ended != calls || r.keys != calls || r.cost != 90*int64(calls) {
			t.Fatalf("%s: the row records %d calls (%d ended, %d keys) costing %d, want %d calls costing %d, each once",
				step, r.calls, r.ended, r.keys, r.cost, calls, 90*calls)
		}
	}

	// The store sends it again itself, within the record's deadline.
	lost := token.New()
	lossy.Arm("INSERT INTO run_calls", testenv.LoseReply)
	if live, err := record(lost); err != nil || !live || !lossy.Fired() {
		t.Fatalf("record whose reply was lost: %v, %v (lost: %v), want it recorded on a later try", live, err, lossy.Fired())
	}
	want("a lost reply's record sent again", 1)
	if live, err := record(lost); err != nil || !live {
		t.Fatalf("record sent again by its caller: %v, %v", live, err)
	}
	want("sent again after it was answered", 1)

	// Recorded once on one connection while another is taken, so that the pool has two idle
	// connections once the test's own statement below has taken the network down with one.
	other, err := f.store.DB().Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := record(token.New()); err != nil {
		t.Fatal(err)
	}
	other.Close()
	want("a second call", 2)

	lossy.Arm("tg-network-down", testenv.GoDown)
	_, _ = f.store.DB().ExecContext(ctx, "SELECT 'tg-network-down'")
	if !lossy.Down() {
		t.Fatal("the network did not go down")
	}
	unsent := token.New()
	// The pool's idle connection first (the driver finds it cannot write), then new ones
	// (each dial fails), each within one record's retries.
	shortCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = f.store.RecordRunCall(shortCtx, runID, unsent, time.Minute, pricing.Usage{Input: 10, Output: 2}, 90, 1, false)
	cancel()
	if err == nil {
		t.Fatal("record with the network down: no error")
	}
	lossy.Restore()
	want("the network down", 2)
	if live, err := record(unsent); err != nil || !live {
		t.Fatalf("record sent again once the network is back: %v, %v", live, err)
	}
	if live, err := record(unsent); err != nil || !live {
		t.Fatalf("record sent again after it landed: %v, %v", live, err)
	}
	want("sent again once the network was back, then again", 3)
}

// TestRecordRunCallRefusedReadOnlyUntilItsDeadline: a call's record refused read_only (1792
// here, from a session whose transactions are read-only: what a demoted primary's read_only
// answers, 1290, is the same refusal) on every try until its deadline fails with that refusal,
// and sent again once writes are taken records the call once: a failover longer than
// admit_timeout no longer drops the record.
func TestRecordRunCallRefusedReadOnlyUntilItsDeadline(t *testing.T) {
	f, _, dsn := newLossyFixtureDSN(t)
	runID := "x_rec_read_only_" + testenv.RandomID(6)
	admitNamed(t, f.store, f.user, runID)
	plain := plainDB(t, dsn)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"tx_read_only": "1"}
	readOnly := holds.NewStore(testenv.Open(t, cfg.FormatDSN()), settlePlans, "standard", zap.NewNop())
	readOnly.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Minute, MaxBackoff: time.Minute})

	callID := token.New()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = readOnly.RecordRunCall(ctx, runID, callID, time.Minute, pricing.Usage{Input: 10, Output: 2}, 90, 1, false)
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1792 {
		t.Fatalf("record refused read_only until its deadline: %v, want the refusal (1792)", err)
	}
	if ok, err := f.store.RecordRunCall(context.Background(), runID, callID, time.Minute, pricing.Usage{Input: 10, Output: 2}, 90, 1, false); err != nil || !ok {
		t.Fatalf("record sent again on a server taking writes: %v, %v", ok, err)
	}
	if r := recordedCalls(t, plain, runID); r.calls != 1 || r.keys != 1 {
		t.Fatalf("%d calls recorded (%d keys), want the one", r.calls, r.keys)
	}
}

// TestRecordRunCallSentAgainAtOnceIsCountedOnce: the records of many calls of one run, each
// sent from several connections at once (a try the caller gave up on, still running, and its
// next), are each counted once: the second record of a call waits for the run's row lock the
// first holds, then finds the call's key taken.
func TestRecordRunCallSentAgainAtOnceIsCountedOnce(t *testing.T) {
	const calls, sends = 40, 3
	f := newSettleFixture(t)
	runID := "x_rec_storm_" + testenv.RandomID(6)
	admitNamed(t, f.store, f.user, runID)
	ids := make([]string, calls)
	for i := range ids {
		ids[i] = token.New()
	}
	var wg sync.WaitGroup
	errs := make(chan error, calls*sends)
	for s := 0; s < sends; s++ {
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				live, err := f.store.RecordRunCall(ctx, runID, id, time.Minute, pricing.Usage{Input: int64(i + 1), Output: 1}, int64(i+1), 1, false)
				if err == nil && !live {
					err = fmt.Errorf("call %d found its run settled", i)
				}
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	r := recordedCalls(t, f.store.DB(), runID)
	if wantCost := int64(calls * (calls + 1) / 2); r.calls != calls || r.ended != calls || r.keys != calls || r.cost != wantCost {
		t.Fatalf("%d calls each sent %d times at once: the row records %d calls (%d ended, %d keys) costing %d; want %d calls costing %d",
			calls, sends, r.calls, r.ended, r.keys, r.cost, calls, wantCost)
	}
}

// TestSettledRunForgetsItsCalls: the settlement of a named run deletes its calls' keys in its
// own transaction (run_calls grows with every call, and a key is only ever read by a record of
// a live run), and a record sent after it, even again for a call recorded before it, finds
// the run settled and adds neither figures nor a key. A prune deletes the keys a settlement
// left (a gateway of before run_calls settling a run a newer one recorded calls of).
func TestSettledRunForgetsItsCalls(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("forgets", "standard")
	runID, leftBehind := "x_forgets", "x_left_behind"
	for _, id := range []string{runID, leftBehind} {
		admitNamed(t, f.store, u, id)
	}
	first := token.New()
	for _, id := range []string{first, token.New()} {
		if live, err := f.store.RecordRunCall(f.ctx(), runID, id, time.Minute, pricing.Usage{Input: 10, Output: 1}, 70, 1, false); err != nil || !live {
			t.Fatalf("record: %v, %v", live, err)
		}
	}
	if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: runID, Usage: pricing.Usage{Input: 20, Output: 2}, CostMicro: 140,
		Calls: 2, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	if r := recordedCalls(t, f.db, runID); r.keys != 0 {
		t.Fatalf("settled run keeps %d call keys, want none", r.keys)
	}
	for _, id := range []string{first, token.New()} {
		if live, err := f.store.RecordRunCall(f.ctx(), runID, id, time.Minute, pricing.Usage{Input: 10, Output: 1}, 70, 1, false); err != nil || live {
			t.Fatalf("record after the settlement: %v, %v; want the run found settled", live, err)
		}
	}
	if r := recordedCalls(t, f.db, runID); r.keys != 0 || r.calls != 2 || r.cost != 140 {
		t.Fatalf("records after the settlement left %d keys and %d calls costing %d, want none and the 2 settled costing 140",
			r.keys, r.calls, r.cost)
	}

	// What a settlement of before run_calls leaves: the keys of a settled run.
	if live, err := f.store.RecordRunCall(f.ctx(), leftBehind, token.New(), time.Minute, pricing.Usage{Input: 10, Output: 1}, 70, 1, false); err != nil || !live {
		t.Fatalf("record: %v, %v", live, err)
	}
	if _, err := f.db.ExecContext(f.ctx(), "UPDATE run_holds SET state = 'settled', settled_at = NOW(6) WHERE run_id = ?", leftBehind); err != nil {
		t.Fatal(err)
	}
	live := "x_live"
	admitNamed(t, f.store, u, live)
	if ok, err := f.store.RecordRunCall(f.ctx(), live, token.New(), time.Minute, pricing.Usage{Input: 10, Output: 1}, 70, 1, false); err != nil || !ok {
		t.Fatalf("record: %v, %v", ok, err)
	}
	f.ageRuns(u, 10)
	if _, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 100); err != nil {
		t.Fatal(err)
	}
	var keys int
	if err := f.db.Get(&keys, "SELECT COUNT(*) FROM run_calls WHERE run_id = ?", leftBehind); err != nil || keys != 0 {
		t.Fatalf("pruned run keeps %d call keys (%v), want none", keys, err)
	}
	if r := recordedCalls(t, f.db, live); r.keys != 1 {
		t.Fatalf("live run keeps %d call keys after a prune, want its 1", r.keys)
	}
}

// admitNamed admits a caller-named run (X-Run-Id) of u with run id runID.
func admitNamed(t *testing.T, st *holds.Store, u holds.User, runID string) {
	t.Helper()
	if _, err := st.Admit(context.Background(), holds.AdmitRequest{RunID: runID, UserID: u.ID, ClientRunID: runID,
		Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour}); err != nil {
		t.Fatalf("admit %s: %v", runID, err)
	}
}

// plainDB is the database of a lossy network's dsn reached around it.
func plainDB(t *testing.T, dsn string) *sqlx.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tcp"
	return testenv.Open(t, cfg.FormatDSN())
}

// rowRecord is what a run's row and run_calls record of its calls.
type rowRecord struct {
	calls, ended, keys int
	cost               int64
}

// recordedCalls reads what a run's row and run_calls record of its calls.
func recordedCalls(t *testing.T, db *sqlx.DB, runID string) rowRecord {
	t.Helper()
	var r rowRecord
	if err := db.QueryRow(`SELECT calls, ended_calls, cost_micro, (SELECT COUNT(*) FROM run_calls WHERE run_id = ?)
		FROM run_holds WHERE run_id = ?`, runID, runID).Scan(&r.calls, &r.ended, &r.cost, &r.keys); err != nil {
		t.Fatalf("read run %s: %v", runID, err)
	}
	return r
}

// TestRecordRunCallRunAfterItsClientLeftIsCountedOnce: a call's record that the database read
// only after its sender had given up on it (a database stalled past the record's deadline, the
// next try sent meanwhile and recorded first), run then, adds nothing. The server runs such a
// script with no client to answer or roll back: before, the figures it added ahead of the
// key's insert were committed a second time, though that insert found the key taken. (A chaos
// run saw named runs charged a call twice across a stall of the database.)
func TestRecordRunCallRunAfterItsClientLeftIsCountedOnce(t *testing.T) {
	f, _, dsn := newLossyFixtureDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runID := "x_rec_left_" + testenv.RandomID(6)
	admitNamed(t, f.store, f.user, runID)
	callID := token.New()
	record := func(ctx context.Context, st *holds.Store) error {
		_, err := st.RecordRunCall(ctx, runID, callID, time.Minute, pricing.Usage{Input: 10, Output: 2}, 90, 1, false)
		return err
	}
	// The next try, recorded.
	if err := record(ctx, f.store); err != nil {
		t.Fatal(err)
	}

	// The earlier try, on a connection whose bytes the database reads only once its sender
	// has given up.
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tcp"
	relay := newHeldRelay(t, cfg.Addr)
	cfg.Addr = relay.addr()
	db, err := holds.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.PingContext(ctx); err != nil { // connected before the database stalls
		t.Fatal(err)
	}
	relay.hold()
	sent, giveUp := context.WithTimeout(ctx, 300*time.Millisecond)
	err = record(sent, holds.NewStore(db, settlePlans, "standard", zap.NewNop()))
	giveUp()
	if err == nil {
		t.Fatal("a record the database did not read before its deadline: no error")
	}
	thread := relay.heldThread.Load()
	if thread == 0 {
		t.Fatal("the record's bytes were not held")
	}
	relay.release() // the database reads it, then its client's end
	plain := plainDB(t, dsn)
	for { // until the database has run it and closed the connection
		var left int
		if err := plain.GetContext(ctx, &left, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE id = ?", thread); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the database still runs the abandoned connection %d: %v", thread, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if r := recordedCalls(t, plain, runID); r.calls != 1 || r.ended != 1 || r.keys != 1 || r.cost != 90 {
		t.Fatalf("a call recorded, then an earlier try of its record run after its sender gave up: the row records %d calls (%d ended, %d keys) costing %d, want the call once (costing 90)",
			r.calls, r.ended, r.keys, r.cost)
	}
}

// heldRelay passes connections' bytes between a client and the database, but while held keeps
// what a client sends from the database, and passes it on, then closes the connection as its
// client did, once released: a database that stalls, then reads what it was sent by a client
// that has gone (its answers meet a closed connection).
type heldRelay struct {
	ln         net.Listener
	target     string
	held       chan struct{} // closed: released
	holding    atomic.Bool
	heldThread atomic.Uint32 // the database's id of the connection whose bytes were held
}

func newHeldRelay(t *testing.T, target string) *heldRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &heldRelay{ln: ln, target: target, held: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go r.relay(client)
		}
	}()
	return r
}

func (r *heldRelay) relay(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", r.target)
	if err != nil {
		return
	}
	defer server.Close()
	var thread atomic.Uint32
	go func() {
		buf := make([]byte, 64<<10)
		for first := true; ; first = false {
			n, err := server.Read(buf)
			if first && n > 9 && buf[4] == 10 { // the greeting: protocol 10, version, then the id
				if end := bytes.IndexByte(buf[5:n], 0); end >= 0 && 5+end+1+4 <= n {
					thread.Store(binary.LittleEndian.Uint32(buf[5+end+1:]))
				}
			}
			if n > 0 {
				if _, err := client.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 && r.holding.Load() {
			r.heldThread.Store(thread.Load())
			<-r.held
		}
		if n > 0 {
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // closes the database's end as the client closed its own
		}
	}
}

func (r *heldRelay) addr() string { return r.ln.Addr().String() }

// hold keeps what the client sends from now on from the database until release.
func (r *heldRelay) hold() { r.holding.Store(true) }

func (r *heldRelay) release() { close(r.held) }
