package proxy_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestFingerprintTakenOverByAnotherResendFirstIsADuplicate: two resends of the same body find
// the fingerprint of a run that has ended, and both would take it over. The one whose
// compare-and-set finds the fingerprint already moved (the other resend's, now running) lost
// the race: it looks again, finds a live run, and is a duplicate of it. Taken for a take-over
// of its own, it ran too: the body ran, and was charged, twice at once.
func TestFingerprintTakenOverByAnotherResendFirstIsADuplicate(t *testing.T) {
	h, gate := gatedHarness(t, func(c *config.Config) { c.Limits.AdmitTimeout = 30 * time.Second })
	u, key := h.user("standard")
	first := sendOK(t, "first", h.gw.URL, key, streamBody, nil)
	h.settled()
	// As if its give-back had not reached Redis: the fingerprint still names the first run.
	sum := sha256.Sum256([]byte("/v1/chat/completions\x00" + streamBody))
	fp := h.keys.Dedup(u.ID, hex.EncodeToString(sum[:]))
	firstRun := first.header.Get(proxy.RunIDHeader)
	if err := h.rdb.Set(context.Background(), fp, firstRun, 0).Err(); err != nil {
		t.Fatal(err)
	}
	hdr, letGo := heldMidStream(t, gate, "other", nil)
	var armed atomic.Bool
	armed.Store(true)
	var other *http.Response
	// The resend has found the first run ended and is about to take its fingerprint over: the
	// other resend does so first, and is running when it goes on.
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step != "fingerprint run live" || !armed.CompareAndSwap(true, false) {
			return
		}
		other = h.post(key, "/v1/chat/completions", streamBody, hdr)
		if other.StatusCode != http.StatusOK {
			t.Errorf("the other resend: %d, want it run", other.StatusCode)
			return
		}
		if _, err := bufio.NewReader(other.Body).ReadString('\n'); err != nil {
			t.Errorf("the other resend's first event: %v", err)
		}
	})
	again := send(h.gw.URL, key, streamBody, nil)
	if armed.Load() {
		t.Fatal("the resend never looked up the ended run: the race is not where the test means it")
	}
	if again.status != http.StatusConflict || errorCode(t, again.body) != "duplicate" {
		t.Errorf("resend that lost the take-over to a running one: %d %s; want 409 duplicate", again.status, again.body)
	}
	letGo()
	if other != nil {
		_, _ = io.Copy(io.Discard, other.Body)
		other.Body.Close()
		h.settled()
		h.expectCharges(u.ID, []string{firstRun, other.Header.Get(proxy.RunIDHeader)}, holds.SourceDuplicate)
	}
}
