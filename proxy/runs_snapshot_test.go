package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestClientSettledRunKeepsAPriceSnapshot: DESIGN §2 — "the settled row stores a snapshot of
// the prices and discount used". A named run settled by POST /v1/runs/{id}/settle must keep
// one, as a one-call run and a reconciled run do.
func TestClientSettledRunKeepsAPriceSnapshot(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-snapshot"}
	first := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "10"))
	readAll(t, first.Body)
	first.Body.Close()
	runID := first.Header.Get(proxy.RunIDHeader)
	if status, body := h.settleRun(key, "task-snapshot"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	var snap *string
	if err := h.store.DB().GetContext(context.Background(), &snap, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	if snap == nil || *snap == "" {
		t.Fatalf("named run settled on request has no price snapshot (NULL)")
	}
	// A one-call run does have one.
	one := h.post(key, "/v1/chat/completions", chatBody, map[string]string{fakellm.HeaderChunks: "5"})
	readAll(t, one.Body)
	one.Body.Close()
	h.settled()
	var snap1 *string
	if err := h.store.DB().GetContext(context.Background(), &snap1, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", one.Header.Get(proxy.RunIDHeader)); err != nil {
		t.Fatal(err)
	}
	if snap1 == nil {
		t.Fatalf("one-call run has no snapshot either")
	}
}
