package proxy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestFingerprintOfAnEndedRunIsTakenOver: a fingerprint that outlives its call (its give-back
// at the answer's end failed, a Redis blip) names a run whose hold is settled. The same body
// sent again within the window is a new request — the caller has its answer — and runs, taking
// the fingerprint over; only a fingerprint of a run still live makes a 409 duplicate.
func TestFingerprintOfAnEndedRunIsTakenOver(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first := sendOK(t, "first", h.gw.URL, key, chatBody, nil)
	h.settled()
	// As if its give-back had not reached Redis: the fingerprint still names the first run.
	sum := sha256.Sum256([]byte("/v1/chat/completions\x00" + chatBody))
	fp := h.keys.Dedup(u.ID, hex.EncodeToString(sum[:]))
	firstRun := first.header.Get(proxy.RunIDHeader)
	if err := h.rdb.Set(context.Background(), fp, firstRun, 0).Err(); err != nil {
		t.Fatal(err)
	}
	again := send(h.gw.URL, key, chatBody, nil)
	h.settled()
	if again.status != 200 {
		t.Fatalf("the same body after the first run ended, its fingerprint left behind: %d %s; want it run", again.status, again.body)
	}
	if owner, err := h.rdb.Get(context.Background(), fp).Result(); err == nil && owner == firstRun {
		t.Fatalf("fingerprint still names the ended run %s; want it taken over", firstRun)
	}
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2", n)
	}
	h.expectCharges(u.ID, []string{firstRun, again.header.Get(proxy.RunIDHeader)})
}
