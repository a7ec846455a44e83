package runstate_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestTallyKeepsUsageParts: the tally is what the reconciler settles a run from when its
// process died before the settlement; it kept the token totals only, so such a run's one-hour
// cache writes and audio tokens, which a provider's invoice lists apart, were lost from its
// row and from the usage report. A call's tally (Add, RecordCallWith) and a named run's
// (Release) carry them; a text call's tally writes no field more than before.
func TestTallyKeepsUsageParts(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	tl := runstate.NewTally(e.rdb, e.keys, time.Hour)
	spoken := pricing.Usage{Input: 1040, AudioInput: 1000, CacheWrite: 418, CacheWrite1h: 400, Output: 300, AudioOutput: 250}

	if err := tl.Add(ctx, "r_parts_add", spoken, 9_000, false); err != nil {
		t.Fatal(err)
	}
	if got, found, err := tl.Get(ctx, "r_parts_add"); err != nil || !found || got.Usage != spoken || got.CostMicro != 9_000 || got.Calls != 1 {
		t.Fatalf("added call's tally %+v found=%v err=%v; want usage %+v, cost 9000, one call", got, found, err, spoken)
	}
	if err := tl.RecordCallWith(ctx, "r_parts_recorded", 1, spoken, 9_000, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got, found, err := tl.Get(ctx, "r_parts_recorded"); err != nil || !found || got.Usage != spoken || got.CostMicro != 9_000 || got.Calls != 1 {
		t.Fatalf("one-call run's tally %+v found=%v err=%v; want usage %+v, cost 9000, one call", got, found, err, spoken)
	}

	if _, err := e.budget.Reserve(ctx, "r_parts_named", "a", 100_000, 10_000, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.budget.Release(ctx, "r_parts_named", "a", spoken, 9_000, false); err != nil {
		t.Fatal(err)
	}
	if got, found, err := tl.Get(ctx, "r_parts_named"); err != nil || !found || got.Usage != spoken || got.Calls != 1 {
		t.Fatalf("named run's tally %+v found=%v err=%v; want usage %+v, one call", got, found, err, spoken)
	}

	// A text call: the fields it always wrote, none for parts it has not.
	text := pricing.Usage{Input: 10, Output: 5}
	if err := tl.Add(ctx, "r_parts_text", text, 100, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.budget.Reserve(ctx, "r_parts_text_named", "a", 100_000, 10_000, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.budget.Release(ctx, "r_parts_text_named", "a", text, 100, false); err != nil {
		t.Fatal(err)
	}
	for run, want := range map[string][]string{
		"r_parts_text": {"cache_read_tok", "cache_write_tok", "calls", "cost_micro", "in_tok", "out_tok"},
		// A named run's release counts its ended calls too (Tallied.Ended).
		"r_parts_text_named": {"cache_read_tok", "cache_write_tok", "calls", "cost_micro", "ended", "in_tok", "out_tok"},
	} {
		fields, err := e.rdb.HKeys(ctx, e.keys.Usage(run)).Result()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(fields)
		if !slices.Equal(fields, want) {
			t.Errorf("text call's tally %s has fields %v, want %v", run, fields, want)
		}
	}
}
