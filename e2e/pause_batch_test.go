package e2e

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestGatewayPausedInsideABatchTransaction: a gateway process stopped (SIGSTOP: a VM's live
// migration, `docker pause`) while one of its batch transactions holds a user's row lock kept
// that user refused 503 on every other gateway for the whole pause: the server waited, inside
// the transaction, for a statement that could not come. The gateway's sessions carry
// idle_transaction_timeout (holds.SessionIdleTransactionTimeout): the server ends the silent
// transaction and frees the row while the process is still stopped, and the live gateway
// serves the user. Resumed, the paused process's caller, whose admission's deadline passed in
// the pause, is refused 503 with nothing held (its writes never went out), and the books
// balance (the world's ledger check).
//
// The stop is placed inside the transaction by a lock the test holds on the user's row: the
// paused gateway's admission waits on it, the process is stopped, and the lock let go, so the
// admission's first script completes into a stopped process.
func TestGatewayPausedInsideABatchTransaction(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("paused-tx", 10, nil)
	p := w.startGateway("gw-paused-tx")
	l := w.startGateway("gw-live-tx")
	ctx := context.Background()

	release := w.lockUser(u.ID)
	pausedCall := make(chan seen, 1)
	go func() {
		pausedCall <- readCall(ctx, p, key, chatRequest(false, 40, "admitted into a pause"), nil, nil)
	}()
	var conn int64 // the paused gateway's connection, waiting on the row
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
	silent := time.Now()

	// Without the bound the wait ends only at SIGCONT (or after wait_timeout, 3 minutes).
	waitFor(t, holds.SessionIdleTransactionTimeout+10*time.Second, "the server to end the paused gateway's transaction", func() bool {
		var n int
		err := w.db.Get(&n, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", conn)
		return err == nil && n == 0
	})
	t.Logf("MEASURED: the paused gateway's transaction ended %v after it went silent (bound %v)",
		time.Since(silent).Round(100*time.Millisecond), holds.SessionIdleTransactionTimeout)
	if s := readCall(ctx, l, key, chatRequest(false, 40, "served while the other gateway is stopped"), nil, nil); !s.complete {
		t.Fatalf("the live gateway's call for the user while the other is stopped: %d %s %v %s", s.status, s.code, s.err, s.body)
	}

	p.signal(t, syscall.SIGCONT)
	stopped = false
	var s seen
	select {
	case s = <-pausedCall:
	case <-time.After(30 * time.Second):
		t.Fatal("the paused gateway's caller had no answer 30 s after SIGCONT")
	}
	if s.status != http.StatusServiceUnavailable || s.code != "billing_unavailable" || s.runID != "" {
		t.Fatalf("the paused gateway's caller: %d %q (run %q) %s; want 503 billing_unavailable, nothing held", s.status, s.code, s.runID, s.body)
	}
	waitFor(t, 10*time.Second, "the live gateway's call to settle", func() bool { return w.liveHoldsOf(u.ID) == 0 })
	var runs int
	if err := w.db.Get(&runs, "SELECT COUNT(*) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if runs != 1 {
		t.Fatalf("%d holds of the user, want 1: the live gateway's call alone", runs)
	}
	// Both gateways serve the user.
	for _, g := range []*gateway{p, l} {
		if s := readCall(ctx, g, key, chatRequest(false, 40, "after the pause on "+g.name), nil, nil); !s.complete {
			t.Fatalf("a call on %s after the pause: %d %s %v %s", g.name, s.status, s.code, s.err, s.body)
		}
	}
}
