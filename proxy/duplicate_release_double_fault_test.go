package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// TestDuplicateInADoubleFaultIsNotChargedItsHold: a plain request that duplicates one still
// running is refused 409 duplicate and releases its fresh hold at 0 in the request itself, with
// the zero tally that says it used nothing. That tally's write is lost (a Redis blip), and the
// database stays out of reach for longer than settle_timeout, so the release gives up and the
// reconciler settles the hold once it expires. The zero tally must have landed by then, as a
// plain call's failed tally does (TestPlainCallInADoubleFaultIsChargedItsUsage): written once
// and given up, the reconciler found no tally on a running hold and charged the refused
// duplicate, which never reached the provider, all it held. A write lost once is landed by
// go-redis's own resend (MaxRetries); one whose every attempt is lost fails, and only the
// gateway's later tries (tallyDuplicateLater) land it.
func TestDuplicateInADoubleFaultIsNotChargedItsHold(t *testing.T) {
	for _, c := range []struct {
		name     string
		wholeTry bool
	}{
		{"one attempt lost", false},
		{"every attempt of a try lost", true},
	} {
		t.Run(c.name, func(t *testing.T) { duplicateInADoubleFault(t, c.wholeTry) })
	}
}

func duplicateInADoubleFault(t *testing.T, wholeTry bool) {
	dsn, lossyDB := testenv.LossyMySQLDSN(t)
	h, lossy := newLossyRedisHarness(t, harnessSetup{db: testenv.Open(t, dsn)}, func(c *config.Config) {
		c.Limits.SettleTimeout = 2 * time.Second
	})
	u, key := h.user("standard")
	orig := h.post(key, "/v1/chat/completions", streamBody,
		map[string]string{fakellm.HeaderChunks: "50", fakellm.HeaderChunkInterval: "100ms"})
	defer orig.Body.Close()
	br := firstEvent(t, orig)

	// The first settlement is the duplicate's release: the database goes out of reach for it.
	reached, resume := h.holdAtFirst("settle")
	go func() {
		<-reached
		lossyDB.TakeDown()
		resume()
	}()
	// The duplicate's zero tally (the one write that carries its settlement's source,
	// "duplicate", as an argument: runstate.Tally.MarkCallUnused), lost before it reaches Redis.
	times := 1
	if wholeTry {
		times = h.rdb.Options().MaxRetries + 1
	}
	lossy.Arm("\r\nduplicate\r\n", testenv.RedisRequestLost, times)
	dup := h.post(key, "/v1/chat/completions", streamBody, nil)
	body := readAll(t, dup.Body)
	dup.Body.Close()
	if dup.StatusCode != http.StatusConflict || errorCode(t, body) != "duplicate" {
		t.Fatalf("resend while the original runs: %d %s, want 409 duplicate", dup.StatusCode, body)
	}
	dupID := dup.Header.Get(proxy.RequestIDHeader)
	if lossy.Fired() != times {
		t.Fatalf("%d zero tally writes lost, want %d", lossy.Fired(), times)
	}
	h.settled() // the duplicate's retries, if any, have landed or given up
	lossyDB.Restore()
	readAll(t, br)
	h.settled()
	if got := h.run(u.ID, dupID); got.State == holds.StateSettled {
		t.Fatalf("duplicate's hold released with the database out of reach: %+v", got)
	}

	if tl, found, err := h.tally.Get(context.Background(), dupID); err != nil || !found || tl.Calls != 0 || tl.CostMicro != 0 ||
		tl.Usage != (pricing.Usage{}) || tl.Source != holds.SourceDuplicate {
		t.Fatalf("tally of the duplicate: %+v found=%v err=%v; want its zero tally (source %s), landed on a later try", tl, found, err, holds.SourceDuplicate)
	}
	h.reconcileExpired(t, "run_id = ?", dupID)
	if r := h.run(u.ID, dupID); r.State != holds.StateSettled || r.ChargedMicro != 0 {
		t.Fatalf("duplicate %s settled as %s by %q, charged %d µUSD of %d held; want 0", dupID, r.State, r.SettleSource.String,
			r.ChargedMicro, r.HeldMicro)
	}
}
