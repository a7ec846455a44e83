package runstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestRefusedAdmissionMarkLapsesWithTheTally: a refused admission's mark is the reconciler's
// evidence for as long as a tally would be (the hold it speaks for is settled well within
// that), and must lapse then, as a tally does: without its expiry it stayed for good, one key
// per admission whose COMMIT reply was lost. It names its own token only.
func TestRefusedAdmissionMarkLapsesWithTheTally(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	const ttl = time.Hour
	tally := runstate.NewTally(rdb, keys, ttl)
	ctx := context.Background()
	const run, tok = "r_refused_mark_lapses", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	if err := tally.MarkRefused(ctx, run, tok); err != nil {
		t.Fatal(err)
	}
	if got := rdb.PTTL(ctx, keys.Refused(run)).Val(); got <= 0 || got > ttl {
		t.Fatalf("the refused admission's mark lives %v; want it to lapse within the tally TTL (%v)", got, ttl)
	}
	for token, want := range map[string]bool{tok: true, "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb": false} {
		if got, err := tally.Refused(ctx, run, token); err != nil || got != want {
			t.Fatalf("Refused(%s) = %v, %v; want %v", token, got, err, want)
		}
	}
}

// TestUnusedTallyLapsesWithTheTally: a run's zero tally (MarkUnused: the evidence that keeps a
// run whose release failed from being charged its hold) lapses as any tally does; without its
// expiry it stayed for good, one key per lost admission or refused named-run call.
func TestUnusedTallyLapsesWithTheTally(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	const ttl = time.Hour
	tally := runstate.NewTally(rdb, keys, ttl)
	ctx := context.Background()
	const run = "r_unused_lapses"
	if err := tally.MarkUnused(ctx, run); err != nil {
		t.Fatal(err)
	}
	if got := rdb.PTTL(ctx, keys.Usage(run)).Val(); got <= 0 || got > ttl {
		t.Fatalf("the zero tally lives %v; want it to lapse within the tally TTL (%v)", got, ttl)
	}
	if got, found, err := tally.Get(ctx, run); err != nil || !found || got.CostMicro != 0 || got.Calls != 0 {
		t.Fatalf("zero tally read as %+v (found %v, %v); want found, at 0", got, found, err)
	}
}
