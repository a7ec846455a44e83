package e2e

import (
	"context"
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
// admission's first script completes into a stopped process.
func TestGatewayPausedInsideABatchTransaction(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("paused-tx", 10, nil)
	p := w.startGatewayWith("gw-paused-tx", w.writeConfig(map[string]string{"limits.admit_timeout": "30s"}))
	l := w.startGateway("gw-live-tx") // admit_timeout 5 s
	ctx := context.Background()

	release := w.lockUser(u.ID)
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
	release()
	waitFor(t, 2*time.Second, "the paused gateway's transaction to hold the user's row", func() bool {
		var n int
		err := w.db.Get(&n, `SELECT COUNT(*) FROM information_schema.INNODB_TRX
			WHERE trx_mysql_thread_id = ? AND trx_state = 'RUNNING' AND trx_rows_locked > 0`, conn)
		return err == nil && n == 1
	})

	// Without the bound this call waits out two lock waits and is refused at admit_timeout.
	sent := time.Now()
	if s := readCall(ctx, l, key, chatRequest(false, 40, "served while the other gateway is stopped"), nil, nil); !s.complete {
		t.Fatalf("the live gateway's call for the user while the other is stopped on its row: %d %s %v %s", s.status, s.code, s.err, s.body)
	}
	t.Logf("MEASURED: the live gateway's call, behind the stopped gateway's transaction, answered in %v (bound %v)",
		time.Since(sent).Round(100*time.Millisecond), holds.SessionIdleTransactionTimeout)
	var left int
	if err := w.db.Get(&left, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", conn); err != nil || left != 0 {
		t.Fatalf("the stopped gateway's connection after the live call: %d left, %v; want it ended by the server", left, err)
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
}
