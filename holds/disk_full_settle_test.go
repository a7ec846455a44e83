package holds_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSettlementRefusedByAFullDiskIsTriedAgainUntilThereIsRoom: MariaDB refuses a write that
// must grow a table on a full disk at once, 1114 "The table … is full" (README Operating it,
// Full disks). The statement is refused before anything of the transaction commits, so the
// settlement may be sent again; given up at once, it left the hold reserved until its expiry
// (hold_ttl: the user's credits and in-flight slot tied up) and the charge to the reconciler's
// figures (its tally, or the hold), for a disk an operator frees in a minute. Here run_holds
// lives on a small file system of the test's own (it needs root), filled up after the call's
// admission; its settlement carries a price snapshot large enough to take pages of its own,
// so it must grow the table, and is refused. Once the refusal is seen, room is made: the
// settlement lands within its settle_timeout, with its own figures and source, charged once.
func TestSettlementRefusedByAFullDiskIsTriedAgainUntilThereIsRoom(t *testing.T) {
	f := newFullDiskFixture(t)
	ctx := context.Background()
	const run = "r_full_disk_settle"
	f.admit(run)
	f.fill()
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: time.Second, SettleTimeout: time.Minute})
	defer w.Close()
	out := settleAsync(w, holds.Settlement{RunID: run, UserID: f.user.ID, CostMicro: 7_000, Calls: 1, Model: "m",
		Source: holds.SourceComplete, PriceSnapshot: []byte(bigSnapshot)})
	s, seen := awaitRefusal(f.logs, out, f.free)
	if s.err != nil {
		t.Fatalf("settlement refused by a full disk, not tried again once there was room: %v", s.err)
	}
	if !seen {
		t.Fatal("the settlement found room on the full disk: the test proves nothing")
	}
	for _, e := range f.logs.Filter(refusedFull).All() {
		if runs, ok := e.ContextMap()["run_ids"].([]any); !ok || len(runs) != 1 || runs[0] != run {
			t.Errorf("retry logged without its run id: %q %v", e.Message, e.ContextMap())
		}
	}
	if !s.res.Applied || s.res.ChargedMicro != 7_000 {
		t.Errorf("settlement answered %+v; want applied, charged 7,000", s.res)
	}
	var row struct {
		State    string `db:"state"`
		Source   string `db:"settle_source"`
		Charged  int64  `db:"charged_micro"`
		Snapshot int    `db:"snapshot"`
	}
	if err := f.db.Get(&row, "SELECT state, settle_source, charged_micro, LENGTH(price_snapshot) AS snapshot FROM run_holds WHERE run_id = ?", run); err != nil {
		t.Fatal(err)
	}
	if row.State != string(holds.StateSettled) || row.Source != holds.SourceComplete || row.Charged != 7_000 || row.Snapshot != len(bigSnapshot) {
		t.Errorf("run's row %+v; want settled by the call (%s) at 7,000 with its snapshot", row, holds.SourceComplete)
	}
	var day struct {
		Used int64 `db:"used_micro"`
		Runs int64 `db:"run_count"`
	}
	if err := f.db.Get(&day, "SELECT COALESCE(SUM(used_micro), 0) AS used_micro, COALESCE(SUM(run_count), 0) AS run_count FROM usage_days WHERE user_id = ?", f.user.ID); err != nil {
		t.Fatal(err)
	}
	if day.Used != 7_000 || day.Runs != 1 {
		t.Errorf("day ledger %+v; want one run charged 7,000", day)
	}
	if bal, err := f.store.Balance(ctx, f.user.ID); err != nil || bal.InFlight != 0 || bal.HeldMicro != 0 {
		t.Errorf("balance %+v, %v: want nothing in flight or held", bal, err)
	}
}

// fullDiskFixture is a store whose run_holds lives on a small file system of the test's own
// (it needs root), with one user and the file that fills that file system once fill is called.
type fullDiskFixture struct {
	t      *testing.T
	db     *sqlx.DB
	store  *holds.Store
	logs   *observer.ObservedLogs
	user   holds.User
	filler string
	purge  func() // lets InnoDB's purge run again (testenv.HoldPurge)
}

func newFullDiskFixture(t *testing.T) *fullDiskFixture {
	dir := testenv.SmallFileSystem(t, "1m")
	db := testenv.MySQL(t)
	// From before the table's first change until room is given back: purge on the full disk
	// stops the server (testenv.HoldPurge), whenever the test's refusal comes.
	purge := testenv.HoldPurge(t, db)
	testenv.TableOn(t, db, "run_holds", dir)
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	core, logs := observer.New(zapcore.WarnLevel)
	st := holds.NewStore(db, settlePlans, "standard", zap.New(core))
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	u, err := st.CreateUser(context.Background(), "full-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	// Room is given back before the database's cleanup drops the table, whatever the test did:
	// left full, InnoDB's purge of the test's changes failed for want of room, and MariaDB
	// 10.11 stops on that (an assertion in row0purge.cc), failing every test after it.
	t.Cleanup(func() { _ = os.Remove(filler) })
	return &fullDiskFixture{t: t, db: db, store: st, logs: logs, user: u, filler: filler, purge: purge}
}

func (f *fullDiskFixture) admit(runID string) {
	f.t.Helper()
	if _, err := f.store.Admit(context.Background(), holds.AdmitRequest{RunID: runID, UserID: f.user.ID,
		State: holds.StateRunning, TTL: 15 * time.Minute}); err != nil {
		f.t.Fatal(err)
	}
}

// fill leaves the file system no room; free gives it back.
func (f *fullDiskFixture) fill() { testenv.Fill(f.t, f.filler) }

func (f *fullDiskFixture) free() {
	f.t.Helper()
	if err := os.Remove(f.filler); err != nil {
		f.t.Fatal(err)
	}
	f.purge()
}

// bigSnapshot is a price snapshot large enough to take pages of its own: a settlement that
// carries it must grow run_holds.
var bigSnapshot = `{"pad":"` + strings.Repeat("x", 256<<10) + `"}`

// refusedFull is a log of a statement refused for a full table.
func refusedFull(e observer.LoggedEntry) bool {
	return strings.Contains(fmt.Sprint(e.ContextMap()["error"]), "1114")
}

// awaitRefusal waits for out's answer, and calls onRefused once the first refusal for a full
// table is logged in logs before it; seen says whether one was (else the test proves nothing).
func awaitRefusal[T any](logs *observer.ObservedLogs, out <-chan T, onRefused func()) (answer T, seen bool) {
	for {
		select {
		case answer = <-out:
			return answer, seen
		case <-time.After(time.Millisecond):
			if !seen && logs.Filter(refusedFull).Len() > 0 {
				seen = true
				onRefused()
			}
		}
	}
}

// TestFullDiskWaitLeavesTheWriterAWorker: a batch of settlements waiting for room holds its
// worker up to settle_timeout, so a writer lets one fewer batches than it has workers wait at
// once. Here, with two workers, one settlement waits; a second refused for a full table
// meanwhile fails at once, left to the reconciler as before (and its hold is not charged); a
// named run's later call (its row changed in place) is admitted on the worker left free, and
// its settlement, which fits where its row is, commits there; once there is room the first
// lands.
func TestFullDiskWaitLeavesTheWriterAWorker(t *testing.T) {
	f := newFullDiskFixture(t)
	ctx := context.Background()
	for _, r := range []string{"r_wait", "r_refused"} {
		f.admit(r)
	}
	// A named run whose later call is admitted while a settlement waits for room (its row is
	// changed in place), and which is then settled where its row is.
	named := holds.AdmitRequest{RunID: "r_named", UserID: f.user.ID, ClientRunID: "agent", State: holds.StateRunning,
		TTL: 15 * time.Minute, Token: testenv.RandomID(16)}
	if _, err := f.store.Admit(ctx, named); err != nil {
		t.Fatal(err)
	}
	f.fill()
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 2, AdmitTimeout: 5 * time.Second, SettleTimeout: time.Minute})
	defer w.Close()
	waiting := settleAsync(w, holds.Settlement{RunID: "r_wait", UserID: f.user.ID, CostMicro: 7_000, Calls: 1,
		Source: holds.SourceComplete, PriceSnapshot: []byte(bigSnapshot)})
	var refused, fits settleOutcome
	var againErr error
	s, seen := awaitRefusal(f.logs, waiting, func() {
		// The first settlement waits for room until the test frees it: whatever follows
		// happens while it waits.
		refused = <-settleAsync(w, holds.Settlement{RunID: "r_refused", UserID: f.user.ID, CostMicro: 5_000, Calls: 1,
			Source: holds.SourceComplete, PriceSnapshot: []byte(bigSnapshot)})
		again := named
		again.Token = testenv.RandomID(16)
		_, againErr = w.Admit(ctx, again)
		fits = <-settleAsync(w, holds.Settlement{RunID: "r_named", UserID: f.user.ID, CostMicro: 3_000, Calls: 2,
			Source: holds.SourceClient})
		f.free()
	})
	if !seen {
		t.Fatalf("the first settlement was never refused for a full table: %+v, %v", s.res, s.err)
	}
	if s.err != nil || !s.res.Applied || s.res.ChargedMicro != 7_000 {
		t.Errorf("the settlement that waited for room: %+v, %v; want charged 7,000", s.res, s.err)
	}
	if refused.err == nil || !strings.Contains(refused.err.Error(), "1114") || errors.Is(refused.err, holds.ErrOutcomeUnknown) {
		t.Errorf("a second settlement refused for room while one waits: %+v, %v; want refused 1114 at once, nothing charged", refused.res, refused.err)
	}
	for _, e := range f.logs.Filter(refusedFull).All() {
		if fmt.Sprint(e.ContextMap()["run_ids"]) == "[r_refused]" {
			t.Errorf("the second settlement refused for room waited for it too, holding the writer's last worker: %q", e.Message)
			break
		}
	}
	if fits.err != nil || !fits.res.Applied || fits.res.ChargedMicro != 3_000 {
		t.Errorf("a settlement that fits its page while another waits for room: %+v, %v; want charged 3,000", fits.res, fits.err)
	}
	if againErr != nil {
		t.Errorf("a named run's later call while a settlement waits for room: %v", againErr)
	}
	var state string
	if err := f.db.Get(&state, "SELECT state FROM run_holds WHERE run_id = 'r_refused'"); err != nil || state == string(holds.StateSettled) {
		t.Errorf("the refused settlement's run: %q, %v; want it left unsettled", state, err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_refused", Source: holds.SourceRelease}); err != nil {
		t.Fatal(err)
	}
	if bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID); err != nil || bal.UsedTodayMicro != 10_000 || bal.InFlight != 0 {
		t.Errorf("balance %+v, %v: want 7,000 and 3,000 charged, nothing in flight", bal, err)
	}
}
