package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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
	h, gate := gatedHarness(t, nil)
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "late-attempt"}

	// Attempt 0, a slow stream, is settled under its call as the reconciler settles a process
	// that looks dead.
	slow := map[string]string{proxy.IdempotencyKeyHeader: "late-attempt", fakellm.HeaderChunks: "40", fakellm.HeaderChunkInterval: "50ms"}
	r, attempt0, letGo := reconciledUnderItsCall(t, h, gate, key, slow)

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
	letGo()
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
	h, gate := gatedHarness(t, nil)
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "late-superseded", proxy.SessionHeader: "late-session"}
	slow := map[string]string{fakellm.HeaderChunks: "200", fakellm.HeaderChunkInterval: "50ms"}
	for k, v := range idem {
		slow[k] = v
	}
	r, attempt0, letGo := reconciledUnderItsCall(t, h, gate, key, slow)
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
	letGo()
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

// TestIdemLateAttemptEndingBeforeTheNextOnesEnd: the late attempt ends while the key's next
// attempt is still running, before anything pinned the key. Its end must not pin the key:
// pinned, the next attempt's own answer could no longer be stored (the key held another
// run's), and every replay was the late attempt's answer, not the one the key's current
// attempt gave its caller.
func TestIdemLateAttemptEndingBeforeTheNextOnesEnd(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	_, key := h.user("standard")
	// Each attempt is held mid-stream at the upstream (gateUpstream) until the test lets it go:
	// streams of a fixed length instead, attempt 0 could end before a slow machine's attempt 1
	// had started, and pin the key itself.
	stream := func(held string) (*http.Response, *bufio.Reader, func()) {
		t.Helper()
		resp, letGo := h.heldStreamOK(t, gate, key, held, map[string]string{proxy.IdempotencyKeyHeader: "late-before-next",
			fakellm.HeaderChunks: "40", fakellm.HeaderChunkInterval: "25ms"})
		r := bufio.NewReader(resp.Body)
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("no first event: %v", err)
		}
		return resp, r, letGo
	}
	first, r0, letGo0 := stream("attempt 0")
	attempt0 := first.Header.Get(proxy.RunIDHeader)
	if res, err := h.store.Settle(context.Background(), holds.Settlement{RunID: attempt0, Source: holds.SourceReconcileHold,
		ChargeHeld: true, Estimated: true}); err != nil || !res.Applied {
		t.Fatalf("settle attempt 0 as the reconciler would: %+v %v", res, err)
	}
	next, r1, letGo1 := stream("attempt 1") // held: still running when attempt 0 ends
	attempt1 := next.Header.Get(proxy.RunIDHeader)
	if attempt1 == attempt0 || next.Header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("retry after attempt 0 was reconciled ran as %s (attempt 0 %s), replayed %q", attempt1, attempt0, next.Header.Get(proxy.ReplayedHeader))
	}

	letGo0()
	if _, err := io.Copy(io.Discard, r0); err != nil {
		t.Fatalf("attempt 0's stream: %v", err)
	}
	var state string
	if err := h.db.Get(&state, "SELECT state FROM run_holds WHERE run_id = ?", attempt1); err != nil || state != string(holds.StateRunning) {
		t.Fatalf("attempt 1 is %q (%v) once attempt 0 has ended; the test needs it running", state, err)
	}
	letGo1()
	rest, err := io.ReadAll(r1)
	if err != nil {
		t.Fatalf("attempt 1's stream: %v", err)
	}
	h.settled()

	again := h.post(key, "/v1/chat/completions", streamBody, map[string]string{proxy.IdempotencyKeyHeader: "late-before-next"})
	replayed := readAll(t, again.Body)
	again.Body.Close()
	if again.StatusCode != http.StatusOK || again.Header.Get(proxy.ReplayedHeader) != "true" || again.Header.Get(proxy.RunIDHeader) != attempt1 ||
		!strings.HasSuffix(string(replayed), string(rest)) {
		t.Errorf("retry after both attempts ended: %d replayed %q run %s (attempt 0 %s, attempt 1 %s) — want attempt 1's answer replayed",
			again.StatusCode, again.Header.Get(proxy.ReplayedHeader), again.Header.Get(proxy.RunIDHeader), attempt0, attempt1)
	}
}

// TestIdemLateAttemptOverARecordWithoutItsCounter: as TestIdemLateAttemptKeepsTheKeysAnswer,
// with the key's record rebuilt without its attempt counter — what Redis holds when it lost the
// record between the retry's move to attempt 1 and attempt 1's pin, which writes the answer and
// not the counter. The late attempt 0 must still not replace the answer: the record names
// another run.
func TestIdemLateAttemptOverARecordWithoutItsCounter(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "late-no-counter"}
	r, attempt0, letGo := reconciledUnderItsCall(t, h, gate, key, map[string]string{proxy.IdempotencyKeyHeader: "late-no-counter",
		fakellm.HeaderChunks: "40", fakellm.HeaderChunkInterval: "50ms"})
	retry := h.post(key, "/v1/chat/completions", streamBody, idem)
	answer1 := readAll(t, retry.Body)
	retry.Body.Close()
	attempt1 := retry.Header.Get(proxy.RunIDHeader)
	if retry.StatusCode != http.StatusOK || attempt1 == attempt0 {
		t.Fatalf("retry after attempt 0 was reconciled: %d run %s (attempt 0 %s)", retry.StatusCode, attempt1, attempt0)
	}
	record := h.keys.Replay(attempt0) // a key's record is named by its attempt 0
	if n, err := h.rdb.HDel(context.Background(), record, "attempt").Result(); err != nil || n != 1 {
		t.Fatalf("drop the record's attempt counter: %d %v", n, err)
	}
	letGo()
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatalf("attempt 0's stream: %v", err)
	}
	h.settled()
	again := h.post(key, "/v1/chat/completions", streamBody, idem)
	replayed := readAll(t, again.Body)
	again.Body.Close()
	if again.StatusCode != http.StatusOK || again.Header.Get(proxy.ReplayedHeader) != "true" ||
		again.Header.Get(proxy.RunIDHeader) != attempt1 || string(replayed) != string(answer1) {
		t.Errorf("retry after both attempts ended: %d replayed %q run %s (attempt 1 %s) — want attempt 1's answer replayed",
			again.StatusCode, again.Header.Get(proxy.ReplayedHeader), again.Header.Get(proxy.RunIDHeader), attempt1)
	}
}

// reconciledUnderItsCall starts an Idempotency-Key attempt (hdr: its key and a slow stream) on
// a gatedHarness, reads its first event and settles its hold under the running call, as the
// reconciler settles a call whose process looks dead (paused past its lease). It returns the
// rest of the stream, the attempt's run id and the func that lets the attempt go on: it is held
// mid-stream at the upstream (gateUpstream) until then, so that it is still running when the
// key's next attempt starts. A stream of a fixed 2 s could end before a slow machine's next
// attempt had moved the key on, and pin the key itself: that attempt was then a replay.
func reconciledUnderItsCall(t *testing.T, h *harness, gate *gateUpstream, key string, hdr map[string]string) (*bufio.Reader, string, func()) {
	t.Helper()
	resp, letGo := h.heldStreamOK(t, gate, key, "attempt 0", hdr)
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("attempt 0: no first event: %v", err)
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	if res, err := h.store.Settle(context.Background(), holds.Settlement{RunID: runID, Source: holds.SourceReconcileHold,
		ChargeHeld: true, Estimated: true}); err != nil || !res.Applied {
		t.Fatalf("settle attempt 0 as the reconciler would: %+v %v", res, err)
	}
	return r, runID, letGo
}

// TestIdemLateFailedAttemptKeepsTheAnswersExpiry: a late attempt (as in
// TestIdemLateAttemptKeepsTheKeysAnswer) that ends without pinning — its caller left — moves
// the key's attempt counter past itself, which the key's later attempt already had, and set
// the record's expiry to replay_ttl again: the pinned answer of attempt 1 was replayed for
// replay_ttl from the late attempt's end, not from the answer (README: "for dedup.replay_ttl
// from the answer"). The record's expiry stands in for an answer stored a while ago.
//
// Without its counter: the key's record rebuilt without the attempt counter (Redis lost the
// record between the retry's move to attempt 1 and attempt 1's pin, which writes the answer
// and not the counter). The late attempt's end must not write the counter nor set the pinned
// answer's expiry again either: the record names another run (advanceScript's guard on
// 'run'), a guard whose loss no other test saw (found by mutation).
func TestIdemLateFailedAttemptKeepsTheAnswersExpiry(t *testing.T) {
	for _, dropCounter := range []bool{false, true} {
		name := map[bool]string{false: "with its counter", true: "without its counter"}[dropCounter]
		t.Run(name, func(t *testing.T) { lateFailedAttemptKeepsTheAnswersExpiry(t, dropCounter) })
	}
}

func lateFailedAttemptKeepsTheAnswersExpiry(t *testing.T, dropCounter bool) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "late-failed"}
	slow := map[string]string{proxy.IdempotencyKeyHeader: "late-failed", fakellm.HeaderChunks: "200", fakellm.HeaderChunkInterval: "50ms"}
	resp := h.post(key, "/v1/chat/completions", streamBody, slow)
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("attempt 0: %d %s", resp.StatusCode, readAll(t, resp.Body))
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("attempt 0: no first event: %v", err)
	}
	attempt0 := resp.Header.Get(proxy.RunIDHeader)
	ctx := context.Background()
	if res, err := h.store.Settle(ctx, holds.Settlement{RunID: attempt0, Source: holds.SourceReconcileHold,
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
	record := h.keys.Replay(attempt0)
	const left = time.Minute // of the answer's replay_ttl
	if err := h.rdb.PExpire(ctx, record, left).Err(); err != nil {
		t.Fatal(err)
	}
	if dropCounter {
		if n, err := h.rdb.HDel(ctx, record, "attempt").Result(); err != nil || n != 1 {
			t.Fatalf("drop the record's attempt counter: %d %v", n, err)
		}
	}

	// The late attempt's caller leaves: attempt 0 ends cancelled, unpinned.
	resp.Body.Close()
	h.settled()
	if ttl, err := h.rdb.PTTL(ctx, record).Result(); err != nil || ttl > left {
		t.Errorf("the key's record expires in %v (%v) after the late attempt ended; its answer had %v left", ttl, err, left)
	}
	if dropCounter {
		if n, err := h.rdb.HExists(ctx, record, "attempt").Result(); err != nil || n {
			t.Errorf("the late attempt's end wrote the counter of a record another attempt pinned (%v)", err)
		}
	}
	again := h.post(key, "/v1/chat/completions", streamBody, idem)
	replayed := readAll(t, again.Body)
	again.Body.Close()
	if again.Header.Get(proxy.ReplayedHeader) != "true" || again.Header.Get(proxy.RunIDHeader) != attempt1 ||
		string(replayed) != string(answer1) {
		t.Errorf("retry after both attempts ended: %d replayed %q run %s, want attempt 1's (%s) answer replayed",
			again.StatusCode, again.Header.Get(proxy.ReplayedHeader), again.Header.Get(proxy.RunIDHeader), attempt1)
	}
	// Two upstream calls (the late attempt and attempt 1), and the replay none.
	if n := h.fake.Calls(); n != 2 {
		t.Errorf("%d upstream calls, want 2", n)
	}
	if n := h.runCount(u.ID); n != 2 {
		t.Errorf("run_count %d, want 2 (the late attempt, charged by the reconciler, and attempt 1)", n)
	}
}
