package holds_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSessionsBoundASilentClient: the gateway's sessions carry the two bounds on a client that
// goes silent — wait_timeout outside a transaction, idle_transaction_timeout inside one (the
// one that frees users' locks) — and a DSN that sets either, in any case, keeps its own.
func TestSessionsBoundASilentClient(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.MySQLDSN(t)
	var got struct {
		Wait int `db:"wait"`
		Idle int `db:"idle"`
	}
	const q = "SELECT @@SESSION.wait_timeout AS wait, @@SESSION.idle_transaction_timeout AS idle"
	if err := testenv.Open(t, dsn).GetContext(ctx, &got, q); err != nil {
		t.Fatal(err)
	}
	if want := int(holds.SessionWaitTimeout / time.Second); got.Wait != want {
		t.Errorf("session wait_timeout %d s, want %d: a dead client's session stays that long", got.Wait, want)
	}
	if want := int(holds.SessionIdleTransactionTimeout / time.Second); got.Idle != want {
		t.Errorf("session idle_transaction_timeout %d s, want %d: a silent client's transaction keeps its locks that long", got.Idle, want)
	}

	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	// In any case, as the server reads a variable's name.
	cfg.Params["WAIT_TIMEOUT"], cfg.Params["Idle_Transaction_Timeout"] = "7", "0"
	for range 4 { // the driver sends a DSN's variables in map order: each open may differ
		if err := testenv.Open(t, cfg.FormatDSN()).GetContext(ctx, &got, q); err != nil {
			t.Fatal(err)
		}
		if got.Wait != 7 || got.Idle != 0 {
			t.Fatalf("a DSN setting WAIT_TIMEOUT=7 and Idle_Transaction_Timeout=0 got %d and %d", got.Wait, got.Idle)
		}
	}
}

// TestBatchPausedBetweenItsScriptsLosesItsLocks: a gateway paused (SIGSTOP, a VM's live
// migration) between a batch's two scripts, or partitioned from the server without a FIN,
// or on a host that died there, holds the batch's users' rows locked: another gateway's
// admission of those users fails its 3 s lock wait, attempt after attempt, until the server
// lets the transaction go. That was wait_timeout (3 min) for a dead host and the whole pause
// for a paused one; it is now SessionIdleTransactionTimeout. The paused gateway, when it
// goes on, finds its connection gone before it sent anything of its writes (the driver says
// so: driver.ErrBadConn), so nothing of the batch committed: its admission is tried again
// while its deadline lasts, and otherwise fails as one known not to have held anything (not
// ErrOutcomeUnknown, which has its caller release and mark what it may have held).
//
// The pause is the batch's write script held back on its way to the server, with the
// defaults of Open: the server sees the client go silent inside the transaction.
func TestBatchPausedBetweenItsScriptsLosesItsLocks(t *testing.T) {
	for _, tc := range []struct {
		name         string
		admitTimeout time.Duration // the paused admission's deadline
		admitted     bool          // it is tried again after the pause, and holds
	}{
		{"deadline passed in the pause", time.Second, false},
		{"deadline after the pause", 30 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			hold := testenv.NewHeldWrite("INSERT INTO run_holds")
			heldDSN, plainDSN := holdingDSN(t, hold)
			plainDB := testenv.Open(t, plainDSN)
			live := holds.NewStore(plainDB, settlePlans, "standard", zap.NewNop())
			// Enough lock waits (3 s each) to outlast the paused transaction's bound several times.
			live.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
			t.Cleanup(func() { testenv.CheckLedger(t, plainDB) })
			u, err := live.CreateUser(ctx, "paused-"+testenv.RandomID(3), "standard")
			if err != nil {
				t.Fatal(err)
			}

			paused := holds.NewStore(testenv.Open(t, heldDSN), settlePlans, "standard", zap.NewNop())
			w := holds.NewWriter(paused, holds.WriterConfig{Workers: 1, AdmitTimeout: tc.admitTimeout, SettleTimeout: 30 * time.Second})
			t.Cleanup(w.Close)
			var letOnce sync.Once
			goOn := func() { letOnce.Do(hold.Let) } // the paused gateway goes on
			t.Cleanup(goOn)                         // before w.Close, whose worker it holds
			pausedAdmit := make(chan error, 1)
			go func() {
				_, err := w.Admit(ctx, holds.AdmitRequest{RunID: "r_paused", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true})
				pausedAdmit <- err
			}()
			select {
			case <-hold.Held():
			case <-time.After(10 * time.Second):
				t.Fatal("the paused gateway's batch never reached its write script")
			}

			// Well under wait_timeout, well over the idle bound plus a lock wait.
			liveCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if _, err := live.Admit(liveCtx, holds.AdmitRequest{RunID: "r_live", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute}); err != nil {
				t.Fatalf("another gateway's admission of the paused batch's user: %v; the paused transaction kept the user's lock", err)
			}

			goOn()
			var want []string
			err = <-pausedAdmit
			switch {
			case tc.admitted && err != nil:
				t.Fatalf("the paused gateway's admission, its deadline ahead: %v; want it tried again and admitted", err)
			case !tc.admitted && (err == nil || errors.Is(err, holds.ErrOutcomeUnknown)):
				t.Fatalf("the paused gateway's admission, its deadline passed: %v; want a failure known to have held nothing", err)
			case tc.admitted:
				want = []string{"r_live:running", "r_paused:running"}
			default:
				want = []string{"r_live:running"}
			}
			var states []string
			if err := plainDB.SelectContext(ctx, &states, "SELECT CONCAT(run_id, ':', state) FROM run_holds WHERE user_id = ? ORDER BY run_id", u.ID); err != nil {
				t.Fatal(err)
			}
			if strings.Join(states, " ") != strings.Join(want, " ") {
				t.Fatalf("holds of the user %v, want %v", states, want)
			}
			for _, run := range want {
				if _, err := live.Settle(ctx, holds.Settlement{RunID: strings.TrimSuffix(run, ":running"), Source: holds.SourceRelease}); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
