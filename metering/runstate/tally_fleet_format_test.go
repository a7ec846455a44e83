package runstate_test

import (
	"context"
	"slices"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// previousReleaseFields are the tally fields a gateway of the release before numbered writes
// (write_seq) reads, by name (Tally.Get's HMGET), and writes: README "Upgrading" promises that
// old and new gateways share Redis during a rolling upgrade, a run tallied by either settled
// from its tally by the other's reconciler. A figure written under a name not in this list
// would be passed over by such a reconciler, and the call charged without it.
var previousReleaseFields = []string{"in_tok", "cache_read_tok", "cache_write_tok", "out_tok", "cost_micro",
	"est_calls", "cache_write_1h_tok", "audio_in_tok", "audio_out_tok", "calls", "price_snapshot"}

// TestTallyFieldsAreThoseAnOlderGatewayReads: a plain call's tally (every figure and prices
// set), a named run's and a call's that used nothing hold no field but those the previous
// release reads, and write_seq, write_ms and settle_source, a plain call's write number, time
// and settlement source, which it passes over — and a tally as the previous release wrote it
// (no write_seq) is read whole and set over whole by the numbered write.
func TestTallyFieldsAreThoseAnOlderGatewayReads(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	u := pricing.Usage{Input: 100, CacheRead: 20, CacheWrite: 30, Output: 40, CacheWrite1h: 10, AudioInput: 5, AudioOutput: 6}
	if err := e.tally.RecordCallWith(ctx, "r_fleet_plain", 1, u, 777, true, []byte(`{"m":1}`), nil); err != nil {
		t.Fatal(err)
	}
	if err := e.tally.Add(ctx, "r_fleet_named", u, 777, true); err != nil {
		t.Fatal(err)
	}
	if err := e.tally.MarkCallUnused(ctx, "r_fleet_unused", "upstream_error"); err != nil {
		t.Fatal(err)
	}
	for run, extra := range map[string][]string{"r_fleet_plain": {"write_seq", "write_ms"}, "r_fleet_named": nil,
		"r_fleet_unused": {"write_ms", "settle_source"}} {
		fields, err := e.rdb.HKeys(ctx, e.keys.Usage(run)).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			if !slices.Contains(previousReleaseFields, f) && !slices.Contains(extra, f) {
				t.Errorf("%s: tally field %q, which a gateway of the previous release does not read (README Upgrading)", run, f)
			}
		}
	}

	// The previous release's plain tally: figures and prices set in one HSET, no write_seq.
	old := "r_fleet_old"
	if err := e.rdb.HSet(ctx, e.keys.Usage(old), "in_tok", 100, "cache_read_tok", 0, "cache_write_tok", 0, "out_tok", 40,
		"cost_micro", 500, "est_calls", 1, "calls", 1, "price_snapshot", `{"m":2}`).Err(); err != nil {
		t.Fatal(err)
	}
	if got, found, err := e.tally.Get(ctx, old); err != nil || !found || got.CostMicro != 500 || got.Calls != 1 ||
		got.EstimatedCalls != 1 || got.Usage.Output != 40 || got.PriceSnapshot != `{"m":2}` {
		t.Errorf("previous release's tally read as %+v found=%v err=%v", got, found, err)
	}
	if err := e.tally.RecordCallWith(ctx, old, 1, pricing.Usage{Input: 100, Output: 50}, 750, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got, _, err := e.tally.Get(ctx, old); err != nil || got.CostMicro != 750 || got.Calls != 1 || got.EstimatedCalls != 0 ||
		got.PriceSnapshot != "" {
		t.Errorf("previous release's tally after a numbered write: %+v (err %v), want that write's alone", got, err)
	}
}
