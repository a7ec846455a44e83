package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemCallerLeavingAtTheRecordReadIsNotAdmittedUnderFailOpen: under dedup.fail_open an
// Idempotency-Key request goes on when its key's record cannot be read (Redis out of reach),
// but a read that failed because its caller left is no outage: the request has no one to
// answer. Its caller leaves while the gateway reads the record, and the read fails with the
// cancelled context. It must end there, answered 499 as a caller that left: no admission tried
// (a hold granted to a caller that has gone, released at 0 if all goes well), no upstream call,
// and no line telling the operator that the record was unreadable and fail_open went on.
func TestIdemCallerLeavingAtTheRecordReadIsNotAdmittedUnderFailOpen(t *testing.T) {
	h, logs := newFailOpenHarness(t)
	_, key := h.user("standard")
	after := leaveAtRecordRead(t, h, key, map[string]string{proxy.IdempotencyKeyHeader: "left-at-read"}, 1)
	if len(after) != 0 {
		t.Errorf("steps after the read its caller left: %v; want none (the call not admitted)", after)
	}
	if n := h.fake.Calls(); n != 0 {
		t.Errorf("%d upstream calls, want none", n)
	}
	if all, _ := h.holdCount(); all != 0 {
		t.Errorf("%d holds after the caller left at its record's read, want none", all)
	}
	expectLeftAtRead(t, logs)
}

// TestIdemCallerLeavingAtTheSettledAttemptsReadIsNotPassedUnderFailOpen: the same departure
// at the record's second read, the one a retry makes once it finds its key's attempt settled
// under it (passSettled: the attempt failed upstream, and its move to the next attempt never
// reached the record). Under dedup.fail_open an unreadable record there sends the retry to
// the attempt's row, and past it to the next attempt; a read that failed because its caller
// left must end the request instead, answered 499: the attempt's row not read, the key not
// moved on, nothing admitted or forwarded.
func TestIdemCallerLeavingAtTheSettledAttemptsReadIsNotPassedUnderFailOpen(t *testing.T) {
	h, logs := newFailOpenHarness(t)
	u, key := h.user("standard")
	const idemKey = "left-at-settled-read"
	idem := map[string]string{proxy.IdempotencyKeyHeader: idemKey}
	if first := send(h.gw.URL, key, chatBody, with(idem, fakellm.HeaderStatus, "500")); first.status != http.StatusBadGateway {
		t.Fatalf("first attempt: %d %s, want 502", first.status, first.body)
	}
	h.settled()
	// The attempt's end, moving the key to its next attempt, is lost: the record says attempt 0.
	record := h.keys.Replay(proxy.IdempotentRunID(u.ID, idemKey, 0))
	if err := h.rdb.HDel(context.Background(), record, "attempt").Err(); err != nil {
		t.Fatal(err)
	}
	calls := h.fake.Calls()
	after := leaveAtRecordRead(t, h, key, idem, 2)
	if len(after) != 0 {
		t.Errorf("steps after the read its caller left: %v; want none (the settled attempt's row not read)", after)
	}
	if n := h.fake.Calls(); n != calls {
		t.Errorf("%d upstream calls after the caller left, want none", n-calls)
	}
	if all, _ := h.holdCount(); all != 1 {
		t.Errorf("%d holds, want the first attempt's alone", all)
	}
	if a, err := h.rdb.HGet(context.Background(), record, "attempt").Result(); err == nil {
		t.Errorf("the key moved on to attempt %s for a caller that had left", a)
	}
	expectLeftAtRead(t, logs)
}

// newFailOpenHarness is a harness under dedup.fail_open whose gateway logs at INFO to logs.
// Its admit_timeout is long: only the caller's leaving ends a step held for it.
func newFailOpenHarness(t *testing.T) (*harness, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, func(c *config.Config) {
		c.Dedup.FailOpen = true
		c.Limits.AdmitTimeout = 30 * time.Second
	})
	return h, logs
}

// leaveAtRecordRead sends an Idempotency-Key request and leaves (cancels it) while the gateway
// is at the nth read of the key's record in its admission (proxy ObserveSteps): the read is
// held until the request's context has ended, then goes on under it. It returns once the call
// is counted answered 499, with the steps the call ran after that read.
func leaveAtRecordRead(t *testing.T, h *harness, key string, hdr map[string]string, nth int32) []string {
	t.Helper()
	at := make(chan struct{})
	var (
		reads  atomic.Int32
		mu     sync.Mutex
		left   bool
		after  []string
		reason error
	)
	h.srv.ObserveSteps(func(ctx context.Context, step string) {
		mu.Lock()
		if left {
			after = append(after, step)
		}
		mu.Unlock()
		if step != "idempotency record read" || reads.Add(1) != nth {
			return
		}
		close(at)
		<-ctx.Done()
		mu.Lock()
		left, reason = true, ctx.Err()
		mu.Unlock()
	})
	leave, done := sendLeaving(h, key, chatBody, hdr)
	defer leave()
	select {
	case <-at:
	case <-done:
		t.Fatalf("the request ended before its record's read %d", nth)
	}
	leave()
	<-done
	expectClientClosed(t, h)
	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(reason, context.Canceled) {
		t.Fatalf("the held read's context ended with %v, want the caller's leaving", reason)
	}
	return append([]string(nil), after...)
}

// expectLeftAtRead checks the gateway logged the call as refused for its caller leaving at the
// record's read, and not that it went on without the record.
func expectLeftAtRead(t *testing.T, logs *observer.ObservedLogs) {
	t.Helper()
	if n := logs.FilterMessage("idempotency record unreadable; going on (fail_open)").Len(); n != 0 {
		t.Errorf("%d lines say the record was unreadable and fail_open went on, for a caller that had left", n)
	}
	refused := logs.FilterMessage("request refused").FilterField(zap.Int("status", 499)).All()
	if len(refused) != 1 || refused[0].ContextMap()["step"] != "idempotency record unreadable" {
		var got []map[string]any
		for _, e := range refused {
			got = append(got, e.ContextMap())
		}
		t.Errorf("refusals of the caller that left: %v; want one, at the idempotency record's read", got)
	}
}
