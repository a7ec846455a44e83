package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestGatewayPausedInsideABatchTransaction: a gateway process stopped (SIGSTOP: a VM's live
// migration, `docker pause`) while one of its batch transactions holds a user's row lock kept
// that user refused 503 on every other gateway for the whole pause: the server waited, inside
// the transaction, for a statement that could not come. The gateway's sessions carry
// idle_transaction_timeout (holds.SessionIdleTransactionTimeout, shorter than a lock wait):
// the server ends the silent transaction and frees the row while the process is still stopped,
// and the live gateway's call for the user, waiting on that row, is served, not refused.
// Resumed, the stopped process finds its transaction gone before its writes went out, tries
// its admission again within its deadline (admit_timeout 30 s here) and serves its caller,
// charged once; the books balance (the world's ledger check).
//
// The stop is placed inside the transaction by a lock the test holds on the user's row: the
// stopped gateway's admission waits on it, the process is stopped, and the lock let go, so the
// admission's first script completes into a stopped process. That the stop landed inside the
// transaction is read afterwards from what survives it, not by watching the transaction's
// seconds of life: resumed, the gateway got its first script's answers, the user's row locked
// FOR UPDATE among them, and found its connection gone when its writes were due (the retry it
// logs). The release waits until every thread of the process is stopped (kill(2) returns
// before they are) and checks the admission still waits then. On a loaded machine the
// admission's lock wait (3 s) can run out before the stop or the release (rows locked in
// INNODB_TRX do not tell: a statement whose lock wait ran out leaves its transaction counting
// the row); nothing was then held in the pause, and the scenario is played again with another
// user, a bounded number of times.
func TestGatewayPausedInsideABatchTransaction(t *testing.T) {
	w := newWorld(t)
	p := w.startGatewayWith("gw-paused-tx", w.writeConfig(map[string]string{"limits.admit_timeout": "30s"}))
	l := w.startGateway("gw-live-tx") // admit_timeout 5 s
	const attempts = 4
	for attempt := 1; attempt <= attempts; attempt++ {
		if pausedInsideBatchTransaction(t, w, p, l, attempt) {
			return
		}
		t.Logf("attempt %d: the paused gateway's lock wait on the test's lock ran out before the stop or the release; the stop held nothing, trying again", attempt)
	}
	t.Fatalf("in %d attempts the stop never landed inside the paused gateway's transaction holding the user's row", attempts)
}

// pausedInsideBatchTransaction plays the scenario once with a new user and reports whether the
// stop landed inside the paused gateway's transaction with the user's row locked. What must
// hold either way (the live call served, the stopped connection ended by the server, the paused
// caller served once the process resumes, each call charged once) is asserted either way.
func pausedInsideBatchTransaction(t *testing.T, w *world, p, l *gateway, attempt int) (landed bool) {
	t.Helper()
	u, key := w.user(fmt.Sprintf("paused-tx-%d", attempt), 10, nil)
	ctx := context.Background()
	logBefore := fileSize(t, p.log)

	release := w.lockUser(u.ID)
	defer release()
	pausedCall := make(chan seen, 1)
	go func() {
		pausedCall <- readCall(ctx, p, key, chatRequest(false, 40, "admitted into a pause"), nil, nil)
	}()
	var conn int64 // the stopped gateway's connection, waiting on the row
	waitFor(t, 10*time.Second, "the paused gateway's admission to wait on the user's row", func() bool {
		return w.db.Get(&conn, `SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE()
			AND ID <> CONNECTION_ID() AND INFO LIKE '%FROM users WHERE id IN%FOR UPDATE%' LIMIT 1`) == nil
	})
	p.signal(t, syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	waitFor(t, 10*time.Second, "the paused gateway to stop", func() bool { return allStopped(t, p.cmd.Process.Pid) })
	// Still waiting now that nothing of the process runs: the stop landed inside the admission's
	// transaction. Not waiting: its lock wait ran out before the stop, and the gateway may have
	// ended that transaction itself, leaving its connection idle outside one.
	var waiting int
	if err := w.db.Get(&waiting, `SELECT COUNT(*) FROM information_schema.INNODB_TRX
		WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'`, conn); err != nil {
		t.Fatal(err)
	}
	release()

	// The live call goes at once, while the stopped transaction (if it got the row) still holds
	// it: without the bound it waits out two lock waits and is refused at admit_timeout.
	sent := time.Now()
	if s := readCall(ctx, l, key, chatRequest(false, 40, "served while the other gateway is stopped"), nil, nil); !s.complete {
		t.Fatalf("the live gateway's call for the user while the other is stopped on its row: %d %s %v %s", s.status, s.code, s.err, s.body)
	}
	t.Logf("MEASURED: the live gateway's call, behind the stopped gateway's transaction, answered in %v (bound %v)",
		time.Since(sent).Round(100*time.Millisecond), holds.SessionIdleTransactionTimeout)
	if waiting == 1 {
		// The process is still stopped, its connection inside a transaction (holding the row, or
		// its statement's lock wait run out since): only the server can end it.
		waitFor(t, 30*time.Second, "the server to end the stopped gateway's connection", func() bool {
			var left int
			return w.db.Get(&left, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", conn) == nil && left == 0
		})
	}

	p.signal(t, syscall.SIGCONT)
	stopped = false
	var s seen
	select {
	case s = <-pausedCall:
	case <-time.After(30 * time.Second):
		t.Fatal("the paused gateway's caller had no answer 30 s after SIGCONT")
	}
	if !s.complete {
		t.Fatalf("the paused gateway's caller, its admission's deadline ahead: %d %q %v %s; want it admitted on a second try and served",
			s.status, s.code, s.err, s.body)
	}
	waitFor(t, 10*time.Second, "both calls to settle", func() bool { return w.liveHoldsOf(u.ID) == 0 })
	var runs int
	if err := w.db.Get(&runs, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND charged_micro > 0", u.ID); err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Fatalf("%d charged holds of the user, want 2: one call on each gateway", runs)
	}
	return waiting == 1 && admissionLostItsConnectionAtItsWrites(t, p.log, logBefore)
}

// allStopped reports whether every thread of process pid is stopped: kill(2) returns before a
// SIGSTOP has reached a running thread.
func allStopped(t *testing.T, pid int) bool {
	t.Helper()
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		t.Fatalf("threads of process %d: %v", pid, err)
	}
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			return false // a thread that just ended, or not readable yet: look again
		}
		// pid (comm) state ...: comm may hold spaces and parentheses, the state follows the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// admissionLostItsConnectionAtItsWrites reports whether the gateway logged, since offset of its
// log, a try of its admission batch failing at its writes for a connection found gone:
// the batch's first script (its START TRANSACTION and the users' FOR UPDATE) had answered, so
// the transaction held the rows, and the server had ended it before the process wrote again.
// A try whose lock wait ran out fails at its reads instead (a conflict, retried quietly).
func admissionLostItsConnectionAtItsWrites(t *testing.T, log string, offset int64) bool {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range bytes.Split(b[offset:], []byte("\n")) {
		var e struct {
			Msg   string `json:"msg"`
			Op    string `json:"op"`
			Error string `json:"error"`
		}
		if json.Unmarshal(line, &e) != nil {
			continue
		}
		if e.Msg == "database unavailable, retrying" && strings.HasPrefix(e.Op, "batch of 0 settlements, 1 admissions") &&
			strings.HasPrefix(e.Error, "write and commit: ") && strings.Contains(e.Error, "bad connection") {
			return true
		}
	}
	return false
}

// fileSize is the length of the file at path now: where the lines it gets next begin.
func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
