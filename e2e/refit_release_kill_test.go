package e2e

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestKilledWhileReleasingAHoldTooSmallForItsPrompt: a long prompt sent while its user's last
// call settles (its settlement stalled on its way to the database) is granted what that
// call's hold leaves, too small for it: admitFitting releases that hold at 0 (releaseUnfit)
// before admitting the call again. The process is SIGKILLed while that release is on its way.
// The call was never forwarded, and the gateway knew it would not be before it sent the
// release; but its hold, running, with no lease and no tally, was left to DESIGN §5 rule 3 and
// charged what it held (reconcile_hold). Marked refused first (markRefused), as a lost
// admission's hold is, it is released at 0 by the reconciler (admit_lost): the user pays for
// the one call answered, and the day ledger is the sum of what the holds were charged.
func TestKilledWhileReleasingAHoldTooSmallForItsPrompt(t *testing.T) {
	w := newWorld(t)
	u, g, relay, ch := longPromptReleaseCaught(t, w, "refit-kill", false)
	<-g.done
	<-ch
	relay.let()
	if n := w.held.calls.Load(); n != 1 {
		t.Fatalf("the upstream got %d calls, want the first only", n)
	}
	small := smallHoldReleasedAtZero(t, w, u, "its release under way at the kill", func(small string) {
		if !bytes.Contains(relay.killedOn, []byte(small)) {
			t.Fatalf("the kill came on a settlement not of the long prompt's hold %s: %s", small, relay.killedOn)
		}
	})
	t.Logf("the small hold %s released when the process died", small)
	if bad, err := holds.Audit(context.Background(), w.db); err != nil || len(bad) > 0 {
		t.Errorf("ledger audit: %v %+v", err, bad)
	}
}

// TestDrainCutWhileReleasingAHoldTooSmallForItsPrompt: as above, but the release of the long
// prompt's small hold stalls (the database does not answer it) and the process is told to stop
// (SIGTERM): its drain's deadline cuts the call while the release is out. The call was never
// forwarded. The request waited for the release until settle_timeout, past cutGrace: its
// connection was closed unanswered (EOF), where a cut call is told 503 shutting_down. It must
// be told so, and its hold come out at 0, the books whole.
func TestDrainCutWhileReleasingAHoldTooSmallForItsPrompt(t *testing.T) {
	w := newWorld(t)
	u, g, relay, ch := longPromptReleaseCaught(t, w, "refit-drain", true)
	g.signal(t, syscall.SIGTERM)
	rep := <-ch
	t.Logf("the long prompt's caller got: %d %s %v", rep.status, rep.body, rep.err)
	_ = g.wait(t, 40*time.Second)
	relay.let()
	if n := w.held.calls.Load(); n != 1 {
		t.Fatalf("the upstream got %d calls, want the first only", n)
	}
	smallHoldReleasedAtZero(t, w, u, "its release out at the drain's cut", nil)
	if rep.status != http.StatusServiceUnavailable || !bytes.Contains(rep.body, []byte(`"shutting_down"`)) {
		t.Errorf("the long prompt's caller, cut at the drain deadline: %d %s %v; want 503 shutting_down", rep.status, rep.body, rep.err)
	}
}

// longPromptReleaseCaught stages both tests' scene: a user (name) with one normal hold (20 000)
// and a little, whose long prompt's first hold is 1 000; a gateway whose database goes through
// a dbRelay catching settlements (stallSecond as given) and whose first call's settlement is held back there;
// then the long prompt, sent (its answer on the channel), whose small hold's release is the
// second settlement, caught by the relay (the gateway killed, or the release stalled).
func longPromptReleaseCaught(t *testing.T, w *world, name string, stallSecond bool) (holds.User, *gateway, *dbRelay, <-chan reply) {
	t.Helper()
	relay := newDBRelay(t, w.mysqlAddr())
	allowance := int64(21_000)
	u, key := w.user(name, 10, &allowance)
	g := w.startGatewayWith("gw-"+name, w.config, "MYSQL_DSN="+w.dsnViaAddr(relay.addr()))
	relay.catchSettlements(g.cmd.Process.Pid, stallSecond)
	first := <-sendAsync(context.Background(), g, key, chatBody(false, 20, "the call that settles"), nil)
	if first.err != nil || first.status != http.StatusOK {
		t.Fatalf("the first call: %d %s %v", first.status, first.body, first.err)
	}
	select {
	case <-relay.stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the first call's settlement never went out")
	}
	ch := sendAsync(context.Background(), g, key, chatBody(false, 20, strings.Repeat("word ", 2000)), nil)
	select {
	case <-relay.killed:
	case <-time.After(10 * time.Second):
		t.Fatal("the long prompt's release never went out")
	}
	return u, g, relay, ch
}

// smallHoldReleasedAtZero finds the long prompt's small hold of u (check, if not nil, looks at
// its run id first), lets a fresh gateway's reconciler settle every hold of u, and checks the
// small hold charged nothing (when says what was under way) and the day ledger the sum of the
// charges. It returns the small hold's run id.
func smallHoldReleasedAtZero(t *testing.T, w *world, u holds.User, when string, check func(small string)) string {
	t.Helper()
	var small string
	if err := w.db.Get(&small, "SELECT run_id FROM run_holds WHERE user_id = ? AND held_micro < 20000", u.ID); err != nil {
		t.Fatalf("the long prompt's small hold: %v", err)
	}
	if check != nil {
		check(small)
	}
	w.startGateway("gw-reconciler")
	waitFor(t, 30*time.Second, "every hold settled", func() bool { return w.liveHoldsOf(u.ID) == 0 })
	r := w.hold(small)
	t.Logf("the small hold: %s charged %d (held %d)", r.SettleSource.String, r.ChargedMicro, r.HeldMicro)
	if r.ChargedMicro != 0 {
		t.Errorf("the long prompt's hold, never forwarded, %s: settled by %q charged %d, want 0", when, r.SettleSource.String, r.ChargedMicro)
	}
	var total int64
	if err := w.db.Get(&total, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if used := w.ledgerUsed(u.ID); used != total {
		t.Errorf("day ledger %d, want Σ charged %d", used, total)
	}
	return small
}
