package proxy_test

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// The money path's Redis writes delivered late: each reaches Redis only after the gateway gave
// up on it (testenv.RedisWriteLate) and went on — resent it, settled, answered the caller —
// and runs after whatever came since, as a delayed TCP segment does. The caller must still be
// charged once what each call cost, and nothing may stay stuck. (A named run's reservation and
// close: runs_late_write_test.go.)

// fingerprints lists the fingerprint keys of a user.
func fingerprints(t *testing.T, h *harness, userID uint64) []string {
	t.Helper()
	fps, err := h.rdb.Keys(context.Background(), h.keys.Prefix+"dedup:{"+strconv.FormatUint(userID, 10)+"}:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return fps
}

// TestPlainCallTallyDeliveredLateCountsTheCallOnce: a plain call's tally, sent with the release
// of its fingerprint (one MULTI/EXEC, which go-redis does not resend), times out: the gateway
// gives the fingerprint back alone and settles from its own figures. The tally then lands, the
// call's only one: the call is charged once and tallied once, and the same request sent again
// meanwhile ran (its fingerprint's late delete is by run id: it deletes no other run's).
func TestPlainCallTallyDeliveredLateCountsTheCallOnce(t *testing.T) {
	h, lossy := newLateRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	// The call's first write naming a tally: the one that gives the fingerprint back.
	lossy.Arm(h.keys.Prefix+"billing:usage:{", testenv.RedisWriteLate, 1)
	first, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{fakellm.HeaderChunks: "5"})
	if fps := fingerprints(t, h, u.ID); len(fps) != 0 {
		t.Fatalf("fingerprint %v still held after the caller has its whole answer", fps)
	}
	h.settled()
	runID := first.Header.Get(proxy.RunIDHeader)
	again, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{fakellm.HeaderChunks: "5"}) // the same request after the first ended
	h.settled()
	deliverAllLate(t, lossy)
	r := h.run(u.ID, runID)
	tl, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found || tl.Calls != 1 || tl.CostMicro != r.ChargedMicro || r.ChargedMicro != fakeGPTCost(r.InTok, 5) {
		t.Fatalf("tally %+v (found %v, %v) of a call charged %d µUSD: want the call once", tl, found, err, r.ChargedMicro)
	}
	h.expectCharges(u.ID, []string{runID, again.Header.Get(proxy.RunIDHeader)})
}

// TestFingerprintClaimDeliveredLateNamesAnEndedRun: a plain request's fingerprint claim (SET
// NX) reaches Redis late. Resent by go-redis and landed, the request runs; refused 503
// dedup_unavailable when every try was late, it does not run and is charged nothing (README).
// Either way the late claim then sets the fingerprint to a run that has ended: the same request
// sent again must run and be charged once, not be refused 409 duplicate for the window.
func TestFingerprintClaimDeliveredLateNamesAnEndedRun(t *testing.T) {
	for _, c := range []struct {
		name  string
		every bool
	}{
		{"resent and landed", false},
		{"every try late", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, lossy := newLateRedisHarness(t, harnessSetup{}, nil)
			u, key := h.user("standard")
			times, want := 1, http.StatusOK
			if c.every {
				times, want = h.rdb.Options().MaxRetries+1, http.StatusServiceUnavailable
			}
			lossy.Arm(h.keys.Prefix+"dedup:{", testenv.RedisWriteLate, times)
			first := h.post(key, "/v1/chat/completions", chatBody, nil)
			body := readAll(t, first.Body)
			first.Body.Close()
			if first.StatusCode != want || (c.every && errorCode(t, body) != "dedup_unavailable") {
				t.Fatalf("request whose claim was late: %d %s, want %d", first.StatusCode, body, want)
			}
			h.settled()
			deliverAllLate(t, lossy)
			if fps := fingerprints(t, h, u.ID); len(fps) != 1 {
				t.Fatalf("fingerprints %v: want the late claim's", fps)
			}
			again, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, nil) // the same request after the late claim landed
			h.settled()
			charged := []string{again.Header.Get(proxy.RunIDHeader)}
			if !c.every {
				charged = append(charged, first.Header.Get(proxy.RunIDHeader))
			}
			h.expectCharges(u.ID, charged, holds.SourceRelease)
		})
	}
}

// TestNamedRunTallyDeliveredLateCountsTheCallOnce: a named run's call tally (the release of
// its reservation) times out; go-redis resends it on a new connection, which lands, and the
// run is settled with the call. The first send then lands: the call's done mark makes it
// count nothing. The run is charged each call once, and its tally counts each once.
func TestNamedRunTallyDeliveredLateCountsTheCallOnce(t *testing.T) {
	h, lossy := newLateRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	runCall(t, h, key, "task-late-tally")
	h.settled()
	runID := proxy.RunIDFor(u.ID, "task-late-tally")
	// Of a call's writes the release alone names the run's lost mark.
	lossy.Arm(h.keys.Lost(runID), testenv.RedisWriteLate, 1)
	runCall(t, h, key, "task-late-tally")
	h.settled()
	if status, body := h.settleRun(key, "task-late-tally"); status != http.StatusOK {
		t.Fatalf("settle: %d %s, want 200", status, body)
	}
	deliverAllLate(t, lossy)
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.Calls != 2 || r.ChargedMicro != 2*fakeGPTCost(r.InTok/2, 5) {
		t.Fatalf("run %+v: want settled with its two calls charged once each", r)
	}
	if tl, found, err := h.tally.Get(context.Background(), runID); err != nil || !found || tl.Calls != 2 || tl.CostMicro != r.ChargedMicro {
		t.Fatalf("tally %+v (found %v, %v): want the two calls once each", tl, found, err)
	}
}

// TestIdemRecordWritesDeliveredLate: each write of an Idempotency-Key's record reaches Redis
// late, after the gateway went on (a start or pin is a MULTI/EXEC, not resent: the pin is
// written again when the call ends; an advance is resent, or fails on every try and the retry
// moves past the attempt itself), and lands only after the caller's retry was answered. The
// key keeps its promise (README): one charge per key, the pinned answer replayed to every
// later retry; a late advance never moves the key back onto an attempt it had left.
func TestIdemRecordWritesDeliveredLate(t *testing.T) {
	const start, pin = "hsetnx", "\r\nctype\r\n"
	advance := proxy.AdvanceIdemScriptSHA
	for _, c := range []struct {
		name   string
		marker string
		every  bool // every try of the write is late
		failed bool // the first attempt is an upstream error: it does not pin the key
	}{
		{"start late", start, false, false},
		{"pin late", pin, false, false},
		{"advance late, resent", advance, false, true},
		{"advance late every try", advance, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, lossy := newLateRedisHarness(t, harnessSetup{}, nil)
			u, key := h.user("standard")
			idem := map[string]string{proxy.IdempotencyKeyHeader: "late-" + testenv.RandomID(4)}
			firstHdr := idem
			if c.failed {
				firstHdr = with(idem, fakellm.HeaderStatus, "500")
			}
			times := 1
			if c.every {
				times = h.rdb.Options().MaxRetries + 1
			}
			lossy.Arm(c.marker, testenv.RedisWriteLate, times)
			first := send(h.gw.URL, key, chatBody, firstHdr)
			h.settled()
			lossy.Disarm()
			retry := send(h.gw.URL, key, chatBody, idem)
			h.settled()
			deliverAllLate(t, lossy)
			third := send(h.gw.URL, key, chatBody, idem)
			h.settled()
			pinned := first
			if c.failed {
				pinned = retry
				if first.status != http.StatusBadGateway || retry.status != http.StatusOK || retry.header.Get(proxy.ReplayedHeader) != "" {
					t.Fatalf("failed attempt %d, its retry %d %v %s: want the retry run as the next attempt", first.status, retry.status, retry.header, retry.body)
				}
				if all := h.expectCharges(u.ID, []string{retry.header.Get(proxy.RunIDHeader)}, holds.SourceUpstreamError); len(all) != 2 {
					t.Fatalf("%d holds, want the failed attempt and the retry's", len(all))
				}
			} else {
				if first.status != http.StatusOK || retry.status != http.StatusOK || retry.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(first.body, retry.body) {
					t.Fatalf("first %d, retry %d %v %s: want the first answer replayed", first.status, retry.status, retry.header, retry.body)
				}
				if n := h.fake.Calls(); n != 1 {
					t.Fatalf("%d upstream calls, want 1", n)
				}
				h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader)})
			}
			if third.status != http.StatusOK || third.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(pinned.body, third.body) {
				t.Fatalf("retry after the late write landed: %d %v %s; want the pinned answer replayed", third.status, third.header, third.body)
			}
		})
	}
}

// TestSessionCallEndMarkDeliveredLate: a session call's end mark (a lone SET, resent by
// go-redis) reaches Redis late; the resend lands before the answer's end goes out, so the same
// message sent at once runs. The late SET then lands on a run whose answer is long final: it
// marks nothing new, and the session's next message runs too, each call charged once.
func TestSessionCallEndMarkDeliveredLate(t *testing.T) {
	h, lossy := newLateRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	session := map[string]string{proxy.SessionHeader: "chat-" + testenv.RandomID(4)}
	lossy.Arm(h.keys.Prefix+"sessdone:{", testenv.RedisWriteLate, 1)
	first := sendOK(t, "first", h.gw.URL, key, chatBody, session)
	runID := first.header.Get(proxy.RunIDHeader)
	if n, err := h.rdb.Exists(context.Background(), h.keys.SessionDone(runID)).Result(); err != nil || n != 1 {
		t.Fatalf("end mark of the answered call: exists %d (%v), want its resend landed", n, err)
	}
	again := sendOK(t, "regenerate after the answer", h.gw.URL, key, chatBody, session)
	h.settled()
	deliverAllLate(t, lossy)
	third := sendOK(t, "regenerate after the late mark landed", h.gw.URL, key, chatBody, session)
	h.settled()
	h.expectCharges(u.ID, []string{runID, again.header.Get(proxy.RunIDHeader), third.header.Get(proxy.RunIDHeader)})
}
