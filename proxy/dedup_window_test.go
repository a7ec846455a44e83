package proxy_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestFingerprintLastsTheWindowNotLonger: a body's fingerprint lives dedup.window (DESIGN §6:
// SET ... NX EX 5), not the call's life: the same body sent again once the window has passed
// is a new request even while the first still runs (a loop that asks the same question every
// few seconds on purpose is not refused). No other test failed when the window was 100 times
// longer.
func TestFingerprintLastsTheWindowNotLonger(t *testing.T) {
	const window = 300 * time.Millisecond
	h, gate := gatedHarness(t, func(c *config.Config) { c.Dedup.Window = window })
	u, key := h.user("standard")
	ctx := context.Background()
	pattern := h.keys.Dedup(u.ID, "*")

	first := make(chan answer, 1)
	// The first runs, held at the upstream, until the resend is answered (held a fixed 2 s
	// instead, it could end before a slow machine's resend).
	go func() { first <- send(h.gw.URL, key, chatBody, map[string]string{"X-Test-Gate": "first"}) }()
	var opened sync.Once
	openFirst := func() { opened.Do(func() { gate.open("first") }) }
	defer openFirst()
	var fp string
	for deadline := time.Now().Add(5 * time.Second); ; {
		keys, err := h.rdb.Keys(ctx, pattern).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 1 {
			fp = keys[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no fingerprint %s was written for the first call", pattern)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ttl, err := h.rdb.PTTL(ctx, fp).Result()
	if err != nil {
		t.Fatal(err)
	}
	// -1: no expiry. (-2, gone already, is within the window: on a loaded machine the key can
	// expire between the look that found it and this one.)
	if ttl == -1 || ttl > window {
		t.Fatalf("fingerprint lives %v, want at most the window (%v)", ttl, window)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		n, err := h.rdb.Exists(ctx, fp).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fingerprint %s outlived its window by seconds", fp)
		}
		time.Sleep(10 * time.Millisecond)
	}
	again := sendOK(t, "same body past the window, first still running", h.gw.URL, key, chatBody, nil)
	select {
	case a := <-first:
		t.Fatalf("the first call ended (%d) before the resend: the test did not show a resend during it", a.status)
	default:
	}
	openFirst()
	a := <-first
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("first call: %d %v %s", a.status, a.err, a.body)
	}
	h.expectCharges(u.ID, []string{a.header.Get(proxy.RunIDHeader), again.header.Get(proxy.RunIDHeader)})
	if n := gate.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2", n)
	}
}
