package proxy_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemAttemptKilledRightAfterItsAdmissionIsChargedOnce: a process killed the moment an
// Idempotency-Key attempt's admission committed, before it wrote the key's record, forwarded
// nothing; the reconciler charges the hold it left (no tally: reconcile_hold). With no record,
// the retry cannot tell this attempt from one that pinned the key before Redis lost its record:
// README Known limits, it is refused 409 idempotent_response_lost, not run, and the key is
// charged once — the attempt's hold. Run again, the key would be charged twice; and a record
// written before the admission to tell the two apart would be written by the retries too,
// so that after a loss a second retry ran a pinned attempt again.
func TestIdemAttemptKilledRightAfterItsAdmissionIsChargedOnce(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "killed-after-admission"}
	attempt0 := proxy.IdempotentRunID(u.ID, "killed-after-admission", 0)

	// The first attempt's process "dies" once its hold is committed: its request goes no
	// further until it is let go, its caller gone, and it writes nothing before that.
	_, resume := h.holdAtFirst("attempt admitted")
	ctx, cancel := context.WithCancel(context.Background())
	first := h.newRequest(key, "/v1/chat/completions", chatBody, idem).WithContext(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(first); err == nil {
			resp.Body.Close()
		}
	}()
	var released bool
	release := func() {
		if !released {
			released = true
			cancel()
			resume()
			<-done
		}
	}
	defer release()
	h.waitLive(u.ID, 1)

	if st := h.reconcileExpired(t, "run_id = ?", attempt0); st.ChargedHeld != 1 {
		t.Fatalf("reconcile of the dead attempt: %+v; want its hold charged (no tally)", st)
	}
	for i := range 2 { // a second retry must not find what the first left and run
		retry := send(h.gw.URL, key, chatBody, idem)
		if retry.status != http.StatusConflict || !bytes.Contains(retry.body, []byte("idempotent_response_lost")) || !bytes.Contains(retry.body, []byte(attempt0)) {
			t.Fatalf("retry %d of an attempt killed after its admission: %d %s; want 409 idempotent_response_lost naming %s",
				i, retry.status, retry.body, attempt0)
		}
	}
	if n := h.fake.Calls(); n != 0 {
		t.Fatalf("%d upstream calls, want 0: the dead attempt forwarded nothing, its retries were not run", n)
	}
	release()
	h.settled()
	runs := h.expectCharges(u.ID, []string{attempt0})
	for _, r := range runs {
		if r.RunID == attempt0 && r.SettleSource.String != holds.SourceReconcileHold {
			t.Errorf("dead attempt settled %s, want %s", r.SettleSource.String, holds.SourceReconcileHold)
		}
	}
}
