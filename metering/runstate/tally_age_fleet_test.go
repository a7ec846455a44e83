package runstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestTallyAgeDoesNotHangOnTheWritersTTL: a one-call run's tally is aged by the time its write
// stored in it, from Redis's clock, not by its TTL run down against the reader's tally_ttl. A
// fleet whose gateways disagree on tally_ttl (one changed, a rolling restart) had the
// reconciler's revisit of a run charged its hold read a tally from a longer one as younger (a
// 96 h one under a 48 h reconciler: never old) and one from a shorter one as older (refunded on
// the final event's figures before its process's late-usage correction). Every writer of a
// one-call run's tally is read here by a reconciler whose tally_ttl is not the writer's.
func TestTallyAgeDoesNotHangOnTheWritersTTL(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := context.Background()
	const readerTTL, leaseTTL, aged = 48 * time.Hour, 30 * time.Second, 3 * time.Hour
	reader := runstate.NewTally(rdb, keys, readerTTL)
	u := pricing.Usage{Input: 10, Output: 5}
	for _, writerTTL := range []time.Duration{96 * time.Hour, time.Hour} {
		writer := runstate.NewTally(rdb, keys, writerTTL)
		for _, c := range []struct {
			what  string
			write func(run string) error
		}{
			{"a call's figures", func(run string) error { return writer.RecordCallWith(ctx, run, 1, u, 70, false, nil, nil) }},
			{"a call that used nothing", func(run string) error { return writer.MarkUnused(ctx, run) }},
		} {
			run := "r_fleet_age_" + writerTTL.String() + "_" + c.what
			if err := c.write(run); err != nil {
				t.Fatal(err)
			}
			_, age, found, err := reader.GetAged(ctx, run)
			if err != nil || !found {
				t.Fatalf("%s under a %v tally_ttl: found %v, %v", c.what, writerTTL, found, err)
			}
			if age < 0 || age >= leaseTTL {
				t.Errorf("%s written just now under a %v tally_ttl, read under %v: aged %v; want under a lease TTL (%v)",
					c.what, writerTTL, readerTTL, age, leaseTTL)
			}
			// Written aged ago: its stored write time set back, as Redis's clock had it then.
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.HSet(ctx, keys.Usage(run), "write_ms", now.Add(-aged).UnixMilli()).Err(); err != nil {
				t.Fatal(err)
			}
			if _, age, _, err = reader.GetAged(ctx, run); err != nil || age < aged || age > aged+time.Minute {
				t.Errorf("%s written %v ago under a %v tally_ttl, read under %v: aged %v (err %v); want %v",
					c.what, aged, writerTTL, readerTTL, age, err, aged)
			}
		}
	}
}

// TestCallsZeroTallyKeepsItsSettlementSource: a one-call run's zero tally keeps the source its
// call was settled as (MarkCallUnused), which the reconciler's revisit reads to say whether the
// call answered nothing; a write of the call's figures after it (a later, numbered write) sets
// the tally whole, and the source with the rest is gone. MarkUnused (a named run's) keeps none.
func TestCallsZeroTallyKeepsItsSettlementSource(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	tally := runstate.NewTally(rdb, runstate.Keys{Prefix: prefix}, time.Hour)
	ctx := context.Background()
	source := func(run string) string {
		t.Helper()
		tl, found, err := tally.Get(ctx, run)
		if err != nil || !found || tl.CostMicro != 0 || tl.Calls != 0 {
			t.Fatalf("zero tally of %s: %+v found %v, %v", run, tl, found, err)
		}
		return tl.Source
	}
	if err := tally.MarkCallUnused(ctx, "r_src_refused", "upstream_error"); err != nil {
		t.Fatal(err)
	}
	if got := source("r_src_refused"); got != "upstream_error" {
		t.Errorf("a call refused by its upstream: source %q, want upstream_error", got)
	}
	if err := tally.MarkUnused(ctx, "r_src_named"); err != nil {
		t.Fatal(err)
	}
	if got := source("r_src_named"); got != "" {
		t.Errorf("MarkUnused: source %q, want none", got)
	}
	if err := tally.RecordCallWith(ctx, "r_src_refused", 1, pricing.Usage{Input: 10}, 70, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	if tl, _, err := tally.Get(ctx, "r_src_refused"); err != nil || tl.Source != "" || tl.CostMicro != 70 {
		t.Errorf("figures written after the zero tally: %+v (%v); want them alone, no source", tl, err)
	}
}
