package proxy_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestIdemRetryOfAnAttemptStoppedBeforeItsRecordIsNotToldItRan: an attempt whose process is
// stopped (or killed) between its admission and the first write of its key's record, its hold
// then charged by a peer's reconciler (reconcile_hold), is answered 409
// idempotent_response_lost on retry (README Known limits: not run again, as a record Redis
// lost cannot be told from one never written). Its answer must not say the request ran and
// its answer was lost: it has not run, and a process only stopped forwards it once resumed,
// answers its caller and pins the key, whose retries then replay that answer.
func TestIdemRetryOfAnAttemptStoppedBeforeItsRecordIsNotToldItRan(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "stopped-before-record"}
	attempt0 := proxy.IdempotentRunID(u.ID, "stopped-before-record", 0)
	reached, resume := h.holdAtFirst("attempt admitted")
	ctx, leave := context.WithCancel(context.Background())
	left := make(chan answer, 1)
	go func() { left <- sendToCtx(ctx, h.gw.URL, "/v1/chat/completions", key, chatBody, idem) }()
	defer func() { leave(); resume(); <-left }()
	<-reached

	if st := h.reconcileExpired(t, "run_id = ?", attempt0); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of the stopped attempt: %+v; want its hold charged (no tally)", st)
	}
	retry := send(h.gw.URL, key, chatBody, idem)
	if retry.status != http.StatusConflict || errorCode(t, retry.body) != "idempotent_response_lost" || errorRunID(t, retry.body) != attempt0 {
		t.Fatalf("retry of the stopped attempt: %d %s; want 409 idempotent_response_lost naming %s", retry.status, retry.body, attempt0)
	}
	if bytes.Contains(retry.body, []byte("already ran")) || bytes.Contains(retry.body, []byte("answer was lost")) {
		t.Errorf("retry of an attempt stopped before its record was told %s: it has not run, and a resumed process answers it", retry.body)
	}
}
