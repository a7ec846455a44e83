package proxy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// plantEndedFingerprint sets the window of chatBody for user to a run that has no hold (as if
// an ended call's give-back had not reached Redis), so that the next plain chatBody call looks
// that run up in the database (the step "fingerprint run live"). It returns the key and run.
func plantEndedFingerprint(t *testing.T, h *harness, userID uint64) (fp, endedRun string) {
	t.Helper()
	sum := sha256.Sum256([]byte("/v1/chat/completions\x00" + chatBody))
	fp = h.keys.Dedup(userID, hex.EncodeToString(sum[:]))
	endedRun = "r_" + "0123456789abcdef0123456789abcdef"
	if err := h.rdb.Set(context.Background(), fp, endedRun, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	return fp, endedRun
}

// holdAtFingerprintLookup makes the first "fingerprint run live" step wait until its context
// ends (the caller leaving, or the admission budget running out), so the lookup then fails
// under it. at is closed once the step is reached.
func holdAtFingerprintLookup(t *testing.T, h *harness) (at <-chan struct{}) {
	t.Helper()
	reached := make(chan struct{})
	var armed atomic.Bool
	armed.Store(true)
	h.srv.ObserveSteps(func(ctx context.Context, step string) {
		if step != "fingerprint run live" || !armed.CompareAndSwap(true, false) {
			return
		}
		close(reached)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second): // a bound, should the context never end
		}
	})
	return reached
}

// TestPlainCallerLeavingAtTheFingerprintLookupIsCountedAsLeft: a caller that leaves while the
// gateway looks up the run its body's fingerprint names makes that lookup fail with its
// cancelled context. That is no billing outage: the call must be counted as a caller that left
// (499), not as a 503 billing_unavailable, and nothing run, held, or taken over.
func TestPlainCallerLeavingAtTheFingerprintLookupIsCountedAsLeft(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Limits.AdmitTimeout = 30 * time.Second })
	u, key := h.user("standard")
	fp, endedRun := plantEndedFingerprint(t, h, u.ID)
	at := holdAtFingerprintLookup(t, h)
	leave, done := sendLeaving(h, key, chatBody, nil)
	defer leave()
	select {
	case <-at:
	case <-done:
		t.Fatal("the request ended before its fingerprint's lookup")
	case <-time.After(20 * time.Second):
		t.Fatal("the request never reached its fingerprint's lookup")
	}
	leave()
	<-done
	expectClientClosed(t, h)
	h.settled()
	if n := h.fake.Calls(); n != 0 {
		t.Errorf("%d upstream calls for a caller that left, want none", n)
	}
	if _, live := h.holdCount(); live != 0 {
		t.Errorf("%d live holds after the caller left, want none", live)
	}
	if owner, err := h.rdb.Get(context.Background(), fp).Result(); err != nil || owner != endedRun {
		t.Errorf("fingerprint names %q (%v), want still %s: a caller that left takes nothing over", owner, err, endedRun)
	}
}

// TestFingerprintLookupFailingOnTheDatabaseIsRefusedUnderFailOpen: dedup.fail_open lets a call
// go on when Redis, the duplicate window, is out of reach; not when the database is, where the
// check finds out whether the run the window names still runs. A call whose lookup fails there
// (here: the holds' table is gone for the lookup) must be refused 503 billing_unavailable,
// nothing forwarded: run on, it could be a second run of a request still running, charged twice.
func TestFingerprintLookupFailingOnTheDatabaseIsRefusedUnderFailOpen(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Dedup.FailOpen = true })
	u, key := h.user("standard")
	plantEndedFingerprint(t, h, u.ID)
	var armed, away atomic.Bool
	armed.Store(true)
	h.srv.ObserveSteps(func(ctx context.Context, step string) {
		if step != "fingerprint run live" || !armed.CompareAndSwap(true, false) {
			return
		}
		if _, err := h.db.ExecContext(ctx, "RENAME TABLE run_holds TO run_holds_away"); err != nil {
			t.Errorf("hiding the holds' table: %v", err)
			return
		}
		away.Store(true)
	})
	a := send(h.gw.URL, key, chatBody, nil)
	if !away.Load() {
		t.Fatalf("the call was answered %d %s without looking its fingerprint's run up", a.status, a.body)
	}
	if _, err := h.db.Exec("RENAME TABLE run_holds_away TO run_holds"); err != nil {
		t.Fatal(err)
	}
	h.settled()
	if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "billing_unavailable" {
		t.Errorf("call whose fingerprint lookup failed on the database under fail_open: %d %s; want 503 billing_unavailable",
			a.status, a.body)
	}
	if n := h.fake.Calls(); n != 0 {
		t.Errorf("%d upstream calls, want none", n)
	}
}
