package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// TestFirstAdmissionNotStartedIsBillingUnavailable: a plain call whose first admission no
// worker took within admit_timeout (nothing held) is answered 503 billing_unavailable, to be
// retried: the 402 for a prompt over its hold (admitFitting's errUnfitReleased) is for a call
// whose small hold was released and whose admission again did not start, not for one that
// never held anything.
func TestFirstAdmissionNotStartedIsBillingUnavailable(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Limits.AdmitTimeout = 300 * time.Millisecond })
	_, key := h.user("standard")
	h.srv.ObserveSteps(func(ctx context.Context, step string) {
		if step == "admit" {
			<-ctx.Done() // its budget runs out before a worker takes it
		}
	})
	a := send(h.gw.URL, key, chatBody, nil)
	if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "billing_unavailable" {
		t.Errorf("a call whose admission never started: %d %s; want 503 billing_unavailable", a.status, a.body)
	}
}
