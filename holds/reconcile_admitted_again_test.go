package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// admitAgainLeases answers that no process serves a run, after admitting the run's next call:
// the later call that lands between the reconciler's scan and its settlement.
type admitAgainLeases struct {
	store *holds.Store
	req   holds.AdmitRequest
	err   chan error
}

func (l admitAgainLeases) Exists(ctx context.Context, runID string) (bool, error) {
	if runID == l.req.RunID {
		_, err := l.store.Admit(ctx, l.req)
		l.err <- err
	}
	return false, nil
}

// TestReconcilerLeavesARunAdmittedAgainAfterItsScan: the reconciler settles a hold only if it
// is still expired under the settlement's row lock (Settlement.OnlyIfExpired). A later call of
// a named run admitted after the scan read the run pushed the expiry out, and its run must not
// be settled under it — at its hold, with the new call's usage then charged to nobody.
// (TestReconcilerDoesNotSettleARunNoLongerExpired covers the store's side of the condition.)
func TestReconcilerLeavesARunAdmittedAgainAfterItsScan(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("agent", 3, nil)
	named := holds.AdmitRequest{RunID: "x_called_after_scan", UserID: u.ID, ClientRunID: "called-after-scan", Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour}
	h, err := e.store.Admit(e.ctx(), named)
	if err != nil {
		t.Fatal(err)
	}
	e.expire(h.RunID)
	leases := admitAgainLeases{store: e.store, req: named, err: make(chan error, 1)}
	st, err := e.pass(e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Leases = leases }))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-leases.err; err != nil {
		t.Fatalf("admission of the run's next call: %v", err)
	}
	if st.Settled() != 0 || st.Extended != 1 {
		t.Errorf("pass %+v: want the run admitted again left alone", st)
	}
	if r := e.run(u, h.RunID); r.State != holds.StateRunning {
		t.Errorf("run %+v: want it still running", r)
	}
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: h.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
