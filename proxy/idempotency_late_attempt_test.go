package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemLateAttemptKeepsTheKeysAnswer: an Idempotency-Key attempt that outlives its hold —
// its process paused (SIGSTOP, a long GC pause, a VM migration) past its lease, or cut off
// from Redis — is settled by the reconciler as a dead process's; the key's retry then runs it
// again as the next attempt, which pins the key with its answer (README "Known limits": two
// answers, both charged). When the late attempt ends after that, it must not pin the key over
// the later attempt's answer: every replay is then the answer of a run that is not the key's
// current attempt, and the caller who got attempt 1's answer, retrying, gets another.
//
// The pause is stood in for by settling the late attempt's hold under its running call, as the
// reconciler does once its lease has lapsed.
func TestIdemLateAttemptKeepsTheKeysAnswer(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "late-attempt"}

	// Attempt 0: a slow stream, forwarding.
	slow := map[string]string{proxy.IdempotencyKeyHeader: "late-attempt", fakellm.HeaderChunks: "40", fakellm.HeaderChunkInterval: "50ms"}
	first := h.post(key, "/v1/chat/completions", streamBody, slow)
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("attempt 0: %d %s", first.StatusCode, readAll(t, first.Body))
	}
	r := bufio.NewReader(first.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("attempt 0: no first event: %v", err)
	}
	attempt0 := first.Header.Get(proxy.RunIDHeader)

	// Its process looks dead: the reconciler settles it at its hold.
	res, err := h.store.Settle(context.Background(), holds.Settlement{RunID: attempt0, Source: holds.SourceReconcileHold,
		ChargeHeld: true, Estimated: true})
	if err != nil || !res.Applied {
		t.Fatalf("settle attempt 0 as the reconciler would: %+v %v", res, err)
	}

	// The retry runs the key again (attempt 1) and pins it.
	retry := h.post(key, "/v1/chat/completions", streamBody, idem)
	answer1 := readAll(t, retry.Body)
	retry.Body.Close()
	attempt1 := retry.Header.Get(proxy.RunIDHeader)
	if retry.StatusCode != http.StatusOK || retry.Header.Get(proxy.ReplayedHeader) != "" || attempt1 == attempt0 {
		t.Fatalf("retry after attempt 0 was reconciled: %d replayed %q run %s (attempt 0 %s), want attempt 1 run",
			retry.StatusCode, retry.Header.Get(proxy.ReplayedHeader), attempt1, attempt0)
	}

	// The late attempt ends.
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatalf("attempt 0's stream: %v", err)
	}
	h.settled()

	// Every later retry replays attempt 1's answer, the one the key's record pinned first.
	again := h.post(key, "/v1/chat/completions", streamBody, idem)
	replayed := readAll(t, again.Body)
	again.Body.Close()
	if again.StatusCode != http.StatusOK || again.Header.Get(proxy.ReplayedHeader) != "true" {
		t.Fatalf("retry after both attempts ended: %d replayed %q %s", again.StatusCode, again.Header.Get(proxy.ReplayedHeader), replayed)
	}
	if got := again.Header.Get(proxy.RunIDHeader); got != attempt1 || string(replayed) != string(answer1) {
		t.Errorf("replay names run %s (attempt 0 %s, attempt 1 %s) and is attempt 1's answer: %v — the late attempt replaced the key's pinned answer",
			got, attempt0, attempt1, string(replayed) == string(answer1))
	}
}

// TestIdemLateAttemptSupersededKeepsTheKeysAnswer: as TestIdemLateAttemptKeepsTheKeysAnswer,
// for a late attempt of a session's message that a newer message stops after its key moved on
// (the cancel published while its process was paused reaches it when it resumes): marking the
// key superseded then turned every retry of it into 409 superseded, though a later attempt had
// pinned its answer.
func TestIdemLateAttemptSupersededKeepsTheKeysAnswer(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "late-superseded", proxy.SessionHeader: "late-session"}
	slow := map[string]string{fakellm.HeaderChunks: "200", fakellm.HeaderChunkInterval: "50ms"}
	for k, v := range idem {
		slow[k] = v
	}
	first := h.post(key, "/v1/chat/completions", streamBody, slow)
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("attempt 0: %d %s", first.StatusCode, readAll(t, first.Body))
	}
	r := bufio.NewReader(first.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("attempt 0: no first event: %v", err)
	}
	attempt0 := first.Header.Get(proxy.RunIDHeader)
	if res, err := h.store.Settle(context.Background(), holds.Settlement{RunID: attempt0, Source: holds.SourceReconcileHold,
		ChargeHeld: true, Estimated: true}); err != nil || !res.Applied {
		t.Fatalf("settle attempt 0 as the reconciler would: %+v %v", res, err)
	}
	retry := h.post(key, "/v1/chat/completions", streamBody, idem)
	answer1 := readAll(t, retry.Body)
	retry.Body.Close()
	attempt1 := retry.Header.Get(proxy.RunIDHeader)
	if retry.StatusCode != http.StatusOK || attempt1 == attempt0 {
		t.Fatalf("retry after attempt 0 was reconciled: %d run %s (attempt 0 %s)", retry.StatusCode, attempt1, attempt0)
	}
	// The newer message's cancel reaches the late attempt now.
	if err := h.rdb.Publish(context.Background(), h.keys.Cancel(attempt0), "superseded").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatalf("attempt 0's stream: %v", err)
	}
	h.settled()
	again := h.post(key, "/v1/chat/completions", streamBody, idem)
	replayed := readAll(t, again.Body)
	again.Body.Close()
	if again.StatusCode != http.StatusOK || again.Header.Get(proxy.ReplayedHeader) != "true" ||
		again.Header.Get(proxy.RunIDHeader) != attempt1 || string(replayed) != string(answer1) {
		t.Errorf("retry after both attempts ended: %d replayed %q run %s (attempt 1 %s) %.200s — want attempt 1's answer replayed",
			again.StatusCode, again.Header.Get(proxy.ReplayedHeader), again.Header.Get(proxy.RunIDHeader), attempt1, replayed)
	}
}
