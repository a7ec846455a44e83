package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
)

// lossyProbe is a lossy network on a fresh database with a table to write to, its handle
// through the lossy network, and a plain one around it.
func lossyProbe(t *testing.T) (*Lossy, *sqlx.DB, *sqlx.DB) {
	t.Helper()
	dsn, lossy := LossyMySQLDSN(t)
	ctx := context.Background()
	db, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tcp"
	plain, err := holds.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plain.Close() })
	if _, err := plain.Exec("CREATE TABLE lossy_probe (id INT PRIMARY KEY, n INT NOT NULL DEFAULT 0) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Exec("INSERT INTO lossy_probe (id) VALUES (0)"); err != nil {
		t.Fatal(err)
	}
	return lossy, db, plain
}

// TestLossyLosesTheReplyOnlyOnceTheServerHasRunIt: a lost reply (LoseReply, GoDown) means the
// server ran the whole marked script — every statement and its COMMIT — and only the reply
// was lost. The loss must wait for that, however long the script takes: a connection closed
// while the server is still at it (a fixed wait that guessed too short) tests another
// scenario, one where the commit had not happened when the caller saw the loss.
func TestLossyLosesTheReplyOnlyOnceTheServerHasRunIt(t *testing.T) {
	scripts := []struct {
		name string
		lock bool // another connection holds row 0 for a second
		q    string
	}{
		{"a statement slower than a guess", false,
			"BEGIN; SELECT SLEEP(0.6) /* lossy-probe */; INSERT INTO lossy_probe (id) VALUES (1); COMMIT"},
		{"a transaction held back by another's lock", true,
			"BEGIN; UPDATE lossy_probe SET n = n + 1 WHERE id = 0 /* lossy-probe */; INSERT INTO lossy_probe (id) VALUES (1); COMMIT"},
	}
	for _, s := range scripts {
		for _, mode := range []LossMode{LoseReply, GoDown} {
			t.Run(s.name+map[LossMode]string{LoseReply: " LoseReply", GoDown: " GoDown"}[mode], func(t *testing.T) {
				lossy, db, plain := lossyProbe(t)
				if s.lock {
					holder := ConsoleTx(t, plain)
					if _, err := holder.Exec("SELECT n FROM lossy_probe WHERE id = 0 FOR UPDATE"); err != nil {
						t.Fatal(err)
					}
					time.AfterFunc(time.Second, func() { _ = holder.Commit() })
				}
				lossy.Arm("/* lossy-probe */", mode)
				start := time.Now()
				_, err := db.Exec(s.q)
				took := time.Since(start)
				if !lossy.Fired() {
					t.Fatal("the marked script's reply was never lost")
				}
				if err == nil {
					t.Fatal("the marked script answered; want its reply lost")
				}
				// Read at once, on a connection around the lossy network: the caller that saw the
				// loss may look at the database the moment it did.
				var n int
				if err := plain.Get(&n, "SELECT COUNT(*) FROM lossy_probe WHERE id = 1"); err != nil {
					t.Fatal(err)
				}
				if n != 1 {
					t.Fatalf("the reply was lost after %v, before the server had run the script: its row is not committed", took)
				}
				if mode == GoDown && !lossy.Down() {
					t.Fatal("GoDown left the network up")
				}
			})
		}
	}
}

// TestLossyLateReplyDeliversTheWholeReplyLate: a late reply is the server's whole reply,
// every result of a multi-statement script, after the lateness the tests count on, however
// quick the server: a caller whose deadline is LateBy/2 (as holds' lost-reply tests set their
// admit_timeout) has seen that deadline pass when the reply comes.
func TestLossyLateReplyDeliversTheWholeReplyLate(t *testing.T) {
	lossy, db, plain := lossyProbe(t)
	lossy.Arm("/* lossy-probe */", LateReply)
	// The caller's deadline, watched but not passed to the query: the reply must come after it.
	callerDeadline, cancel := context.WithTimeout(context.Background(), LateBy/2)
	defer cancel()
	rows, err := db.Query("BEGIN; SELECT 7 /* lossy-probe */; INSERT INTO lossy_probe (id) VALUES (1); SELECT 42; COMMIT")
	if err != nil {
		t.Fatal(err)
	}
	deadlinePassed := callerDeadline.Err() != nil
	var got []int
	for {
		for rows.Next() {
			var v int
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			got = append(got, v)
		}
		if !rows.NextResultSet() {
			break
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if !lossy.Fired() {
		t.Fatal("the marked script's reply was never delayed")
	}
	if !deadlinePassed {
		t.Errorf("the late reply came before a caller's deadline of LateBy/2 (%v) had passed", LateBy/2)
	}
	if len(got) != 2 || got[0] != 7 || got[1] != 42 {
		t.Errorf("late reply's results %v, want [7 42]", got)
	}
	var n int
	if err := plain.Get(&n, "SELECT COUNT(*) FROM lossy_probe WHERE id = 1"); err != nil || n != 1 {
		t.Fatalf("row of the late script: %d, %v; want committed", n, err)
	}
}

// errorRecorder is a test whose errors are recorded instead of failing it.
type errorRecorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *errorRecorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestLossyFailsLoudlyWhenTheServerNeverFinishes: a marked write the server has not run by
// the deadline fails the test, with a message that says so, whether the server has not
// answered at all or has begun to answer a script and is still running it. It must not go on
// to stage a loss of a reply to a script that has not run. That the wait ended at its
// deadline, not at the server's end 3 s later, is in the message: it found no reply yet, or
// the server's thread still at the script.
func TestLossyFailsLoudlyWhenTheServerNeverFinishes(t *testing.T) {
	for _, c := range []struct{ name, q, want string }{
		{"no reply yet", "SELECT SLEEP(3) /* lossy-probe */", "no reply to the marked write"},
		{"a script half run", "SELECT 1 /* lossy-probe */; SELECT SLEEP(3)", `still "Query"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &errorRecorder{TB: t}
			dsn, lossy := LossyMySQLDSN(rec)
			lossy.mu.Lock()
			lossy.limit = 300 * time.Millisecond
			lossy.mu.Unlock()
			db := Open(t, dsn)
			lossy.Arm("/* lossy-probe */", LoseReply)
			_, err := db.Exec(c.q)
			if err == nil {
				t.Fatal("the marked script answered")
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], c.want) {
				t.Fatalf("errors reported to the test: %q; want one saying %q", rec.errs, c.want)
			}
		})
	}
}

// TestLossyWaitsForTheServerWhenTheCallerLeaves: a caller that gives up while the marked
// script runs closes its connection (the driver does, on its context's end). The loss still
// waits for the server to be done with the script — until its thread has ended — so that
// what the test then reads of the database is the script's final outcome, not a moment of it.
func TestLossyWaitsForTheServerWhenTheCallerLeaves(t *testing.T) {
	lossy, db, plain := lossyProbe(t)
	lossy.Arm("/* lossy-probe */", LoseReply)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := db.ExecContext(ctx, "BEGIN; SELECT SLEEP(0.6) /* lossy-probe */; INSERT INTO lossy_probe (id) VALUES (1); COMMIT")
	if err == nil || !lossy.Fired() {
		t.Fatalf("caller that left: %v, fired %v; want an error from a loss", err, lossy.Fired())
	}
	callerLeft := ctx.Err() != nil
	// The script's outcome is final when no server thread is still at it: asked of the server
	// the moment the loss ended, not read again after a pause that a late write may outlast.
	var busy []struct {
		ID      int64   `db:"ID"`
		Command string  `db:"COMMAND"`
		Info    *string `db:"INFO"`
	}
	if err := plain.Select(&busy, `SELECT ID, COMMAND, INFO FROM information_schema.PROCESSLIST
		WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND <> 'Sleep'`); err != nil {
		t.Fatal(err)
	}
	for _, b := range busy {
		info := ""
		if b.Info != nil {
			info = *b.Info
		}
		t.Errorf("when the loss ended, server thread %d was still %s %q: the script's outcome was not final", b.ID, b.Command, info)
	}
	// Its caller had left (100 ms) when the call ended: the case under test, in which the
	// driver closed the connection while the server was still sleeping.
	if !callerLeft {
		t.Errorf("the call ended before its caller left (after 100ms): the loss did not wait for the server")
	}
	var n int
	if err := plain.Get(&n, "SELECT COUNT(*) FROM lossy_probe WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	t.Logf("the server, its client gone mid-script, left %d row(s)", n)
}

// TestLossyKilledReplyAnswersTheCommitInterrupted: a KilledReply is the server's whole script
// run and committed, and its reply as the server sent it but for the last statement's answer,
// which is ER_QUERY_INTERRUPTED; the connection stays usable.
func TestLossyKilledReplyAnswersTheCommitInterrupted(t *testing.T) {
	lossy, db, plain := lossyProbe(t)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lossy.Arm("/* lossy-probe */", KilledReply)
	_, err = conn.ExecContext(context.Background(),
		"BEGIN; UPDATE lossy_probe SET n = n + 1 WHERE id = 0 /* lossy-probe */; INSERT INTO lossy_probe (id) VALUES (1); COMMIT")
	if !lossy.Fired() {
		t.Fatal("the marked script was never answered killed")
	}
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1317 {
		t.Fatalf("the marked script answered %v; want ER_QUERY_INTERRUPTED (1317)", err)
	}
	var n int
	if err := plain.Get(&n, "SELECT COUNT(*) FROM lossy_probe WHERE id = 1"); err != nil || n != 1 {
		t.Fatalf("%d rows, %v: want the script committed", n, err)
	}
	if err := conn.QueryRowContext(context.Background(), "SELECT n FROM lossy_probe WHERE id = 0").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the connection afterwards: n %d, %v; want it usable, reading the committed update", n, err)
	}
}
