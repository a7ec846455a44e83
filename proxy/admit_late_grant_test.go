package proxy_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// lateGrantAdmitTimeout is the admission budget of the late-grant tests: long enough that a
// loaded machine's call reaches the statement the test stalls within it (at 1 s a descheduled
// handler or a slow first script was refused before the stall, and the test waited for a stall
// that never came), and well within the gateway's lock wait bound (lateGrantLockWait), after
// which the stalled statement would fail rather than be granted late.
const lateGrantAdmitTimeout = 2 * time.Second

// lateGrantLockWait is the innodb_lock_wait_timeout of the late-grant tests' gateways, set
// in their DSN over holds.Open's 3 s: with the budget at 2 s, 3 s left the test one second to
// see the stall and let the lock go before the statement failed. Nothing here depends on its
// length.
const lateGrantLockWait = 10 * time.Second

// lateGrantDB is a fresh test database whose sessions wait lateGrantLockWait on a lock.
func lateGrantDB(t *testing.T) *sqlx.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = strconv.Itoa(int(lateGrantLockWait / time.Second))
	return testenv.Open(t, cfg.FormatDSN())
}

// lockUsersHolds holds, in an open REPEATABLE READ transaction on a connection of its own (an
// operator's console, a report), every hold of userID locked, and with them the index gap a new
// hold of that user goes into: the batch's first script (the user's row, the reads) goes
// through, and its second — the hold's INSERT and the COMMIT, whose outcome the writer waits
// for past the admission's deadline (holds.Writer.Admit) — waits on the gap until the
// transaction ends. Like testenv.ConsoleTx, the session has no idle_transaction_timeout: with
// the gateway's (2 s, holds.Open) the server ended the transaction, and let the INSERT through,
// two seconds after the lock was taken, whether or not the test had seen the stall yet.
func lockUsersHolds(t *testing.T, db *sqlx.DB, userID uint64) *sqlx.Tx {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var me *mysql.MySQLError
	if _, err := conn.ExecContext(ctx, "SET SESSION idle_transaction_timeout = 0"); err != nil && !(errors.As(err, &me) && me.Number == 1193) {
		conn.Close()
		t.Fatal(err)
	}
	tx, err := conn.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tx.Rollback()
		// Never pooled again with the console's setting.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		conn.Close()
	})
	var ids []string
	if err := tx.Select(&ids, "SELECT run_id FROM run_holds WHERE user_id = ? FOR UPDATE", userID); err != nil {
		t.Fatal(err)
	}
	return tx
}

// sendPastTheBudget sends call while lock stalls its statement stmt, lets the lock go once that
// statement has waited past lateGrantAdmitTimeout, and returns the answer, which must be the
// late refusal (what names the call in the error): 503 billing_unavailable, Retry-After: 1.
func sendPastTheBudget(t *testing.T, db *sqlx.DB, lock *sqlx.Tx, stmt, what string, call func() answer) answer {
	t.Helper()
	answered := make(chan answer, 1)
	go func() { answered <- call() }()
	waitStalledPast(t, db, stmt, lateGrantAdmitTimeout)
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	a := <-answered
	if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "billing_unavailable" || a.header.Get("Retry-After") != "1" {
		t.Errorf("%s: %d Retry-After %q %s; want 503 billing_unavailable, Retry-After: 1", what, a.status, a.header.Get("Retry-After"), a.body)
	}
	return a
}

// waitStalledPast waits until a statement like stmt has waited longer than budget: begun after
// the call's body was read whole, it is then past the call's admission deadline.
func waitStalledPast(t *testing.T, db *sqlx.DB, stmt string, budget time.Duration) {
	t.Helper()
	waitFor(t, "a statement like "+stmt+" stalled past "+budget.String(), func() bool {
		var n int
		err := db.Get(&n, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE ? AND INFO NOT LIKE '%PROCESSLIST%' AND TIME_MS > ?`,
			"%"+stmt+"%", budget.Milliseconds())
		return err == nil && n > 0
	})
}

// TestHoldGrantedAfterTheAdmitBudgetIsReleasedNotForwarded: a hold whose transaction MariaDB
// stalls on a lock past admit_timeout, and grants once the lock is let go, was forwarded
// upstream seconds late: the writer waits for a batch's writes and COMMIT past the admission's
// deadline, so that a committed hold is never lost, and nothing after it compared the clock
// with that deadline. Whatever the call's kind, it must now be answered 503
// billing_unavailable with Retry-After: 1, never reach the upstream, have its hold released at
// 0 with the balance untouched, and be logged with its run id.
func TestHoldGrantedAfterTheAdmitBudgetIsReleasedNotForwarded(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	// A plain call's fingerprint is checked after its hold, within the budget: under
	// dedup.fail_open its check past the budget failed and the call went on, forwarded late.
	gateways := map[bool]*harness{}
	for _, failOpen := range []bool{false, true} {
		gateways[failOpen] = newHarnessOn(t, harnessSetup{db: lateGrantDB(t), log: zap.New(core)}, func(c *config.Config) {
			c.Limits.AdmitTimeout = lateGrantAdmitTimeout
			c.Dedup.FailOpen = failOpen
		})
	}
	for _, tc := range []struct {
		name, path, body string
		hdr              map[string]string
		failOpen         bool
	}{
		{"chat", "/v1/chat/completions", chatBody, nil, false},
		{"chat stream", "/v1/chat/completions", streamBody, nil, false},
		{"messages", "/v1/messages", `{"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`, nil, false},
		{"messages stream", "/v1/messages", `{"model":"claude-test","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil, false},
		{"responses", "/v1/responses", `{"model":"fake-gpt","input":"hi"}`, nil, false},
		{"embeddings", "/v1/embeddings", `{"model":"fake-gpt","input":"hi"}`, nil, false},
		{"completions", "/v1/completions", `{"model":"fake-gpt","prompt":"hi"}`, nil, false},
		{"idempotency key", "/v1/chat/completions", chatBody, map[string]string{proxy.IdempotencyKeyHeader: "late-" + testenv.RandomID(4)}, false},
		{"session", "/v1/chat/completions", chatBody, map[string]string{proxy.SessionHeader: "late-" + testenv.RandomID(4)}, false},
		{"named run", "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "late-run"}, false},
		{"chat fail_open", "/v1/chat/completions", chatBody, nil, true},
		{"chat stream fail_open", "/v1/chat/completions", streamBody, nil, true},
		{"messages fail_open", "/v1/messages", `{"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`, nil, true},
		{"responses fail_open", "/v1/responses", `{"model":"fake-gpt","input":"hi"}`, nil, true},
		{"embeddings fail_open", "/v1/embeddings", `{"model":"fake-gpt","input":"hi"}`, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := gateways[tc.failOpen]
			u, key := h.user("standard")
			before, err := h.store.Balance(context.Background(), u.ID)
			if err != nil {
				t.Fatal(err)
			}
			lock := lockUsersHolds(t, h.db, u.ID)
			calls := h.fake.Calls()
			sendPastTheBudget(t, h.db, lock, "INSERT INTO run_holds", "call whose hold was granted past admit_timeout",
				func() answer { return sendTo(h.gw.URL, tc.path, key, tc.body, tc.hdr) })
			h.settled()
			if n := h.fake.Calls(); n != calls {
				t.Errorf("%d upstream calls, want none: the call was forwarded after its admission budget was spent", n-calls)
			}
			// A named run's failed call leaves its run open, for the agent's retry: settled,
			// it is charged nothing.
			named := tc.hdr["X-Run-Id"]
			if named != "" {
				if status, body := h.settleRun(key, named); status != http.StatusOK {
					t.Fatalf("settle the named run: %d %s", status, body)
				}
			}
			runs := h.holdsOf(u.ID)
			if len(runs) != 1 {
				t.Fatalf("%d holds, want the one granted late", len(runs))
			}
			run := runs[0]
			if run.State == holds.StateRunning || run.ChargedMicro != 0 || (named == "" && run.SettleSource.String != holds.SourceRelease) {
				t.Errorf("late hold %s: %s, charged %d by %q; want released at 0", run.RunID, run.State, run.ChargedMicro, run.SettleSource.String)
			}
			after, err := h.store.Balance(context.Background(), u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if after.AvailableMicro != before.AvailableMicro || after.UsedTodayMicro != before.UsedTodayMicro || after.InFlight != 0 {
				t.Errorf("balance %+v after the refusal, want %+v as before", after, before)
			}
			refused := logs.FilterMessage("request refused").FilterField(zap.String("run_id", run.RunID)).All()
			if len(refused) != 1 || refused[0].ContextMap()["code"] != "billing_unavailable" {
				t.Errorf("refusal lines naming run %s: %v; want one, billing_unavailable", run.RunID, refused)
			}
			if noise := logs.FilterMessage("idempotency record not started").FilterField(zap.String("run_id", run.RunID)).All(); len(noise) != 0 {
				t.Errorf("a refused late attempt logged its record's write failing: %v; want the refusal alone", noise)
			}
			if tc.hdr[proxy.IdempotencyKeyHeader] != "" {
				// The refused attempt left its key free: the SDK's retry runs, once.
				if again := sendTo(h.gw.URL, tc.path, key, tc.body, tc.hdr); again.status != http.StatusOK {
					t.Errorf("retry under the same Idempotency-Key: %d %s, want 200", again.status, again.body)
				}
				if n := h.fake.Calls(); n != calls+1 {
					t.Errorf("%d upstream calls after the retry, want 1", n-calls)
				}
			}
		})
	}
}

// TestSessionClaimCommittedAfterTheAdmitBudgetIsNotForwarded: the budget is checked again just
// before forwarding, after the steps that follow the hold. A session's claim whose COMMIT is
// answered late — sent within the budget, its reply past it: a COMMIT is waited for whatever
// its context says — came back a success, and the call, its hold granted in time, was forwarded
// after admit_timeout had run out. It is answered 503 billing_unavailable (Retry-After: 1)
// instead, nothing forwarded, its hold released at 0.
func TestSessionClaimCommittedAfterTheAdmitBudgetIsNotForwarded(t *testing.T) {
	// The COMMIT is late by the budget's whole length: the claim's reply, sent after the body
	// was read, arrives past the budget whenever the claim began within it. The budget also
	// covers every step before the claim (the hold's batch, the fingerprint), which at 250 ms
	// (testenv.LateBy * 5/6) a loaded machine could spend before the claim was sent, and the
	// call was refused before the step the test is about.
	const admitTimeout = 2 * time.Second
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	h := newHarnessOn(t, harnessSetup{db: db}, func(c *config.Config) { c.Limits.AdmitTimeout = admitTimeout })
	u, key := h.user("standard")
	before, err := h.store.Balance(context.Background(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The claim's COMMIT is the next write to carry one: the hold's batch has committed.
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "session claim" {
			lossy.ArmLate("COMMIT", admitTimeout)
		}
	})
	calls := h.fake.Calls()
	a := send(h.gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: "late-claim"})
	if !lossy.Fired() {
		t.Fatal("the session claim's COMMIT was not answered late")
	}
	if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "billing_unavailable" || a.header.Get("Retry-After") != "1" {
		t.Errorf("call whose session claim committed past admit_timeout: %d Retry-After %q %s; want 503 billing_unavailable, Retry-After: 1",
			a.status, a.header.Get("Retry-After"), a.body)
	}
	h.settled()
	if n := h.fake.Calls(); n != calls {
		t.Errorf("%d upstream calls, want none: the call was forwarded after its admission budget was spent", n-calls)
	}
	runs := h.holdsOf(u.ID)
	if len(runs) != 1 || runs[0].State == holds.StateRunning || runs[0].ChargedMicro != 0 || runs[0].SettleSource.String != holds.SourceRelease {
		t.Fatalf("holds %+v; want the one, released at 0", runs)
	}
	if after, err := h.store.Balance(context.Background(), u.ID); err != nil || after.AvailableMicro != before.AvailableMicro || after.InFlight != 0 {
		t.Errorf("balance %+v (%v) after the refusal, want %+v as before", after, err, before)
	}
}

// TestAdmissionStalledOnTheUsersRowPastTheBudgetHoldsNothing: an admission that waits on the
// user's row (locked by an operator's console) past admit_timeout, the lock then let go, is
// answered 503 billing_unavailable, Retry-After: 1, logged with its run id, and holds nothing:
// the batch's reads run under the admission's deadline, which ends them (the driver closes the
// connection; the server's statement, still waiting, finds it gone), so the writes and COMMIT
// are never sent (unlike a stall in those, which the writer waits out:
// TestHoldGrantedAfterTheAdmitBudgetIsReleasedNotForwarded). When the answer comes:
// TestAdmissionWaitingOnTheUsersRowIsAnsweredWhileTheLockIsHeld.
func TestAdmissionStalledOnTheUsersRowPastTheBudgetHoldsNothing(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	l := lockUsersRow(t, lateGrantDB(t), zap.New(core), lateGrantAdmitTimeout)
	a := sendPastTheBudget(t, l.h.db, l.lock, "FROM users WHERE id IN", "call whose admission waited on the user's row past admit_timeout",
		func() answer { return send(l.h.gw.URL, l.key, chatBody, nil) })
	l.heldNothing(t)
	runID := a.header.Get(proxy.RequestIDHeader)
	if refused := logs.FilterMessage("request refused").FilterField(zap.String("run_id", runID)).All(); len(refused) != 1 {
		t.Errorf("%d refusal lines naming run %s, want one", len(refused), runID)
	}
}

// TestAdmissionWaitingOnTheUsersRowIsAnsweredWhileTheLockIsHeld: an admission that waits on
// its user's row, locked by an operator's console, is answered 503 billing_unavailable when its
// admit_timeout runs out, the lock still held and the batch's lock wait not yet ended — not once
// the session's innodb_lock_wait_timeout (3 s, holds.Open) ends it, retried or not: the batch's
// reads run under the earliest deadline of its admissions, and the driver ends the waiting read
// at that deadline by closing its connection (the server then rolls back what the script
// began). The lock is let go only once the answer has come; the 30 s wait for it is a watchdog
// against a hang, not a timing. A lock wait that ended first would have been retried (a
// conflict, logged so) before the answer. The call holds nothing, reaches no upstream, and the
// user's next call, the lock gone, runs.
func TestAdmissionWaitingOnTheUsersRowIsAnsweredWhileTheLockIsHeld(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	// 2 s: under the lock wait's 3 s (this gateway's is holds.Open's), so a lock wait that
	// ended first is told apart, and long enough, as the neighbours' budget, that a busy
	// machine does not spend it before the batch reaches the row (the refusal's error then
	// names another step, and the test fails).
	l := lockUsersRow(t, nil, zap.New(core), 2*time.Second)
	answered := make(chan answer, 1)
	go func() { answered <- send(l.h.gw.URL, l.key, chatBody, nil) }()
	var a answer
	select {
	case a = <-answered:
	case <-time.After(30 * time.Second):
		t.Fatal("no answer within 30 s while the user's row stayed locked")
	}
	// The batch's lock waits that ended before the answer, each retried as a conflict.
	lockWaitsEnded := logs.FilterMessage("transaction conflict, retrying").Len()
	// Still held here: the answer came while the lock was.
	if err := l.lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "billing_unavailable" || a.header.Get("Retry-After") != "1" {
		t.Fatalf("call whose admission waited on the user's locked row: %d Retry-After %q %s; want 503 billing_unavailable, Retry-After: 1",
			a.status, a.header.Get("Retry-After"), a.body)
	}
	if lockWaitsEnded != 0 {
		t.Errorf("%d lock waits of the batch timed out before the answer; want it answered at its deadline, during the first", lockWaitsEnded)
	}
	runID := a.header.Get(proxy.RequestIDHeader)
	refused := logs.FilterMessage("request refused").FilterField(zap.String("run_id", runID)).All()
	if len(refused) != 1 {
		t.Fatalf("%d refusal lines naming run %s, want one", len(refused), runID)
	}
	// Refused waiting on the user's row, not before it was reached.
	if why, _ := refused[0].ContextMap()["error"].(string); !strings.Contains(why, "lock users: context deadline exceeded") {
		t.Errorf("refusal's error %q; want the deadline's, met waiting on the user's row (lock users)", why)
	}
	l.heldNothing(t)
	if next := send(l.h.gw.URL, l.key, chatBody, nil); next.status != http.StatusOK {
		t.Errorf("the user's next call, the lock gone: %d %s, want 200", next.status, next.body)
	}
}

// lockedUsersRow is a gateway whose one user's row a console transaction holds locked (FOR
// UPDATE), as an operator's open transaction in a SQL console would, with what the user had
// before any call.
type lockedUsersRow struct {
	h      *harness
	user   holds.User
	key    string
	before holds.Balance
	calls  int64 // the upstream's calls before any of the test's
	lock   *sqlx.Tx
}

// lockUsersRow starts a gateway on db (nil: a fresh test database) logging to log at
// admitTimeout, makes its user and locks the user's row.
func lockUsersRow(t *testing.T, db *sqlx.DB, log *zap.Logger, admitTimeout time.Duration) lockedUsersRow {
	t.Helper()
	h := newHarnessOn(t, harnessSetup{db: db, log: log}, func(c *config.Config) { c.Limits.AdmitTimeout = admitTimeout })
	u, key := h.user("standard")
	before, err := h.store.Balance(context.Background(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	lock := testenv.ConsoleTx(t, h.db)
	var id uint64
	if err := lock.Get(&id, "SELECT id FROM users WHERE id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	return lockedUsersRow{h: h, user: u, key: key, before: before, calls: h.fake.Calls(), lock: lock}
}

// heldNothing checks, once the gateway's settlements are done, that no call reached the
// upstream and the user has no hold and the balance it had.
func (l lockedUsersRow) heldNothing(t *testing.T) {
	t.Helper()
	l.h.settled()
	if n := l.h.fake.Calls(); n != l.calls {
		t.Errorf("%d upstream calls, want none", n-l.calls)
	}
	if runs := l.h.holdsOf(l.user.ID); len(runs) != 0 {
		t.Errorf("holds %+v after the refusal, want none", runs)
	}
	if after, err := l.h.store.Balance(context.Background(), l.user.ID); err != nil || after.AvailableMicro != l.before.AvailableMicro || after.InFlight != 0 {
		t.Errorf("balance %+v (%v) after the refusal, want %+v as before", after, err, l.before)
	}
}
