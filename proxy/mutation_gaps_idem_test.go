package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// Gaps found by mutating proxy/dedup.go and proxy/idempotency.go: each test here failed with
// one mutant that every other test let through.

// TestFingerprintOfAnEndedCallIsNotGivenBackOverItsSuccessor: a call gives back its body's
// fingerprint only while the fingerprint still names its run (endScript's compare-and-delete).
// The first call outlives its fingerprint (the window lapsed: deleted here as its expiry
// would), the same body sent then runs and takes the fingerprint; the first's end must leave
// it, or a third resend while the second still runs is run and charged beside it. No other
// test failed when the give-back deleted the key whatever it named: on either path, with the
// tally of a call answered whole, or alone (giveFingerprintBack) for one that failed upstream.
func TestFingerprintOfAnEndedCallIsNotGivenBackOverItsSuccessor(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hdr   map[string]string // the first call's
		first int               // its answer's status
	}{
		// Answered whole: the give-back rides with its tally (tallyWithFingerprint).
		{"answered", nil, http.StatusOK},
		// Failed upstream: given back alone, at the handler's end (endFingerprint).
		{"failed upstream", map[string]string{fakellm.HeaderStatus: "500"}, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) { fingerprintNotGivenBackOverSuccessor(t, tc.hdr, tc.first) })
	}
}

func fingerprintNotGivenBackOverSuccessor(t *testing.T, firstHdr map[string]string, firstStatus int) {
	h, gate := gatedHarness(t, func(c *config.Config) { c.Dedup.Window = time.Minute })
	u, key := h.user("standard")
	ctx := context.Background()

	first := make(chan answer, 1)
	go func() {
		first <- send(h.gw.URL, key, chatBody, with(firstHdr, "X-Test-Gate", "first"))
	}()
	defer gate.open("first")
	gate.await(t, "first", 1)
	fps, err := h.rdb.Keys(ctx, h.keys.Dedup(u.ID, "*")).Result()
	if err != nil || len(fps) != 1 {
		t.Fatalf("fingerprints of the first call: %v %v, want one", fps, err)
	}
	// The window lapses while the first still runs.
	if err := h.rdb.Del(ctx, fps[0]).Err(); err != nil {
		t.Fatal(err)
	}

	second := make(chan answer, 1)
	go func() { second <- send(h.gw.URL, key, chatBody, map[string]string{"X-Test-Gate": "second"}) }()
	defer gate.open("second")
	gate.await(t, "second", 1)

	gate.open("first")
	a := <-first
	if a.err != nil || a.status != firstStatus {
		t.Fatalf("first call: %d %v %s, want %d", a.status, a.err, a.body, firstStatus)
	}
	secondRun, err := h.rdb.Get(ctx, fps[0]).Result()
	if err != nil {
		t.Fatalf("the second call's fingerprint is gone once the first ended: %v", err)
	}

	third := send(h.gw.URL, key, chatBody, nil)
	if third.status != http.StatusConflict || errorCode(t, third.body) != "duplicate" || errorRunID(t, third.body) != secondRun {
		t.Fatalf("resend while the second runs: %d %s, want 409 duplicate of %s", third.status, third.body, secondRun)
	}
	gate.open("second")
	b := <-second
	if b.err != nil || b.status != http.StatusOK {
		t.Fatalf("second call: %d %v %s", b.status, b.err, b.body)
	}
	if firstStatus == http.StatusOK {
		h.expectCharges(u.ID, []string{a.header.Get(proxy.RunIDHeader), b.header.Get(proxy.RunIDHeader)}, "duplicate")
	}
	if n := gate.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2", n)
	}
}

// TestFingerprintTakenOverLastsTheWindow: a fingerprint left naming a call that has ended (its
// give-back lost: it lapses on its own, README) is taken over by the same body sent again, and
// the taken-over fingerprint lapses with dedup.window too, as a fresh one does. No other test
// failed when the take-over wrote it without an expiry: one whose give-back then failed too
// stayed in Redis for good, where the window promises it lapses.
func TestFingerprintTakenOverLastsTheWindow(t *testing.T) {
	const window = time.Minute
	h, gate := gatedHarness(t, func(c *config.Config) { c.Dedup.Window = window })
	u, key := h.user("standard")
	ctx := context.Background()

	a := sendOK(t, "first call", h.gw.URL, key, chatBody, nil)
	h.waitLive(u.ID, 0)
	firstRun := a.header.Get(proxy.RunIDHeader)
	// Its give-back lost: the fingerprint still names the first, ended, call.
	fps, err := h.rdb.Keys(ctx, h.keys.Dedup(u.ID, "*")).Result()
	if err != nil || len(fps) != 0 {
		t.Fatalf("fingerprints after the first call: %v %v, want none", fps, err)
	}
	second := make(chan answer, 1)
	go func() { second <- send(h.gw.URL, key, chatBody, map[string]string{"X-Test-Gate": "second"}) }()
	defer gate.open("second")
	gate.await(t, "second", 1)
	fps, err = h.rdb.Keys(ctx, h.keys.Dedup(u.ID, "*")).Result()
	if err != nil || len(fps) != 1 {
		t.Fatalf("fingerprints of the second call: %v %v, want one", fps, err)
	}
	fp := fps[0]
	// Stand the fingerprint back on the first call, as its lost give-back left it; the third
	// sending takes it over from the ended run.
	if err := h.rdb.Set(ctx, fp, firstRun, window).Err(); err != nil {
		t.Fatal(err)
	}
	third := make(chan answer, 1)
	go func() { third <- send(h.gw.URL, key, chatBody, map[string]string{"X-Test-Gate": "third"}) }()
	defer gate.open("third")
	gate.await(t, "third", 1)
	owner, err := h.rdb.Get(ctx, fp).Result()
	if err != nil || owner == firstRun {
		t.Fatalf("fingerprint names %q (%v), want the third call's run", owner, err)
	}
	ttl, err := h.rdb.PTTL(ctx, fp).Result()
	if err != nil || ttl <= 0 || ttl > window {
		t.Fatalf("taken-over fingerprint lives %v (%v), want at most the window (%v)", ttl, err, window)
	}
	gate.open("second")
	gate.open("third")
	b, c := <-second, <-third
	if b.status != http.StatusOK || c.status != http.StatusOK {
		t.Fatalf("second %d %s, third %d %s", b.status, b.body, c.status, c.body)
	}
	h.expectCharges(u.ID, []string{firstRun, b.header.Get(proxy.RunIDHeader), c.header.Get(proxy.RunIDHeader)})
	if n := gate.fake.Calls(); n != 3 {
		t.Fatalf("%d upstream calls, want 3", n)
	}
}

// TestIdemRetryAfterAFailedAttemptRunsTheNextAttemptsRun: a key's retry after attempt 0
// failed runs attempt 1, under the run id derived from (user, key, 1): a paused attempt n
// finds that the key moved on past it by the row of attempt n+1 (laterAttempt), which a
// counter that skipped a number would never show. No other test failed when the counter
// moved two past a failed attempt.
func TestIdemRetryAfterAFailedAttemptRunsTheNextAttemptsRun(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const idemKey = "next-attempt"
	a := send(h.gw.URL, key, chatBody, map[string]string{"Idempotency-Key": idemKey, fakellm.HeaderStatus: "500"})
	if a.status != http.StatusBadGateway || a.header.Get(proxy.RunIDHeader) != proxy.IdempotentRunID(u.ID, idemKey, 0) {
		t.Fatalf("first: %d run %q %s, want 502 under attempt 0", a.status, a.header.Get(proxy.RunIDHeader), a.body)
	}
	h.settled()
	b := send(h.gw.URL, key, chatBody, map[string]string{"Idempotency-Key": idemKey})
	if want := proxy.IdempotentRunID(u.ID, idemKey, 1); b.status != http.StatusOK || b.header.Get(proxy.RunIDHeader) != want {
		t.Fatalf("retry: %d run %q %s, want 200 under attempt 1 (%s)", b.status, b.header.Get(proxy.RunIDHeader), b.body, want)
	}
	h.settled()
	h.expectCharges(u.ID, []string{b.header.Get(proxy.RunIDHeader)}, holds.SourceUpstreamError)
}

// TestIdemRecordOfARunningAttemptLapsesWithReplayTTL: the record an attempt's admission starts
// (the body its key was first used with) lives dedup.replay_ttl from the start, before any end
// of the attempt writes it again: an attempt whose process is killed mid-call leaves a record
// that lapses, and the key is free again after replay_ttl (README). No other test failed when
// the start wrote the record without an expiry: the key stayed 422 for any other body for good.
func TestIdemRecordOfARunningAttemptLapsesWithReplayTTL(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	ctx := context.Background()
	const idemKey = "running-record"
	first := make(chan answer, 1)
	go func() {
		first <- send(h.gw.URL, key, chatBody, map[string]string{"Idempotency-Key": idemKey, "X-Test-Gate": "call"})
	}()
	defer gate.open("call")
	gate.await(t, "call", 1)
	rec := h.keys.Replay(proxy.IdempotentRunID(u.ID, idemKey, 0))
	body, err := h.rdb.HGet(ctx, rec, "body").Result()
	if err != nil || body == "" {
		t.Fatalf("record %s of the running attempt: body %q (%v), want it started", rec, body, err)
	}
	ttl, err := h.rdb.PTTL(ctx, rec).Result()
	if replayTTL := h.cfg.Dedup.ReplayTTL; err != nil || ttl <= 0 || ttl > replayTTL {
		t.Fatalf("record of the running attempt lives %v (%v), want at most replay_ttl (%v)", ttl, err, replayTTL)
	}
	gate.open("call")
	a := <-first
	if a.status != http.StatusOK {
		t.Fatalf("call: %d %s", a.status, a.body)
	}
	h.settled()
	h.expectCharges(u.ID, []string{a.header.Get(proxy.RunIDHeader)})
	if n := gate.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
}
