package runstate_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestRecordCallEarlierWriteLandingLateChangesNothing: a one-call run's tally is written at
// the call's final event (write 1: an estimate, with prices) and set again beside its
// settlement (write 2: the usage reported after it). Write 1, held up in the network past the
// client's read timeout, reaches Redis after write 2. The tally must still be write 2's alone
// — its figures, no estimated mark, no prices — as it is when they land in order: set blindly,
// write 1's figures stood, and the reconciler settled the run from them.
func TestRecordCallEarlierWriteLandingLateChangesNothing(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	early, late := pricing.Usage{Input: 10, Output: 5}, pricing.Usage{Input: 10, Output: 50}
	want := runstate.Tallied{Usage: late, CostMicro: 525, Calls: 1}
	for _, order := range []string{"in order", "early write last"} {
		run := "r_seq_" + order
		writes := []func() error{
			func() error { return e.tally.RecordCallWith(ctx, run, 1, early, 75, true, []byte(`{"m":1}`), nil) },
			func() error { return e.tally.RecordCallWith(ctx, run, 2, late, 525, false, nil, nil) },
		}
		if order == "early write last" {
			writes[0], writes[1] = writes[1], writes[0]
		}
		for _, w := range writes {
			if err := w(); err != nil {
				t.Fatal(err)
			}
		}
		if got, found, err := e.tally.Get(ctx, run); err != nil || !found || got != want {
			t.Errorf("%s: tally %+v found=%v err=%v, want write 2's alone %+v", order, got, found, err, want)
		}
		if ttl := e.rdb.PTTL(ctx, e.keys.Usage(run)).Val(); ttl <= 0 {
			t.Errorf("%s: tally without a TTL (%v)", order, ttl)
		}
	}
}

// TestRecordCallOverwritesATallyOfNoSeq: a tally the script cannot read a seq from — no hash
// (written by hand), or one of a gateway of before the seqs — is set over, as the HSET on an
// emptied key that came before the script was.
func TestRecordCallOverwritesATallyOfNoSeq(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	u := pricing.Usage{Input: 3, Output: 4}
	for name, seed := range map[string]func(key string) error{
		"no hash":    func(key string) error { return e.rdb.Set(ctx, key, "junk", time.Hour).Err() },
		"no seq":     func(key string) error { return e.rdb.HSet(ctx, key, "calls", 1, "cost_micro", 9, "est_calls", 1).Err() },
		"seq no int": func(key string) error { return e.rdb.HSet(ctx, key, "write_seq", "x", "cost_micro", 9).Err() },
	} {
		run := "r_noseq_" + name
		if err := seed(e.keys.Usage(run)); err != nil {
			t.Fatal(err)
		}
		if err := e.tally.RecordCallWith(ctx, run, 1, u, 7, false, nil, nil); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := runstate.Tallied{Usage: u, CostMicro: 7, Calls: 1}
		if got, found, err := e.tally.Get(ctx, run); err != nil || !found || got != want {
			t.Errorf("%s: tally %+v found=%v err=%v, want %+v", name, got, found, err, want)
		}
	}
}

// BenchmarkRecordCall compares a one-call run's tally write, as the call sends it (one
// MULTI/EXEC), done by the numbered script (RecordCallWith) and by the DEL + HSET + EXPIRE
// that came before it: the script must cost the call's path no measurable latency. Besides
// the round trip (ns/op) it reports the time Redis spent on the write's commands
// (server-µs/op: EXEC's time in INFO commandstats; the test Redis must serve nothing else
// meanwhile).
func BenchmarkRecordCall(b *testing.B) {
	rdb, prefix := testenv.Redis(b)
	keys := runstate.Keys{Prefix: prefix}
	tally := runstate.NewTally(rdb, keys, time.Hour)
	ctx := context.Background()
	u := pricing.Usage{Input: 1200, CacheRead: 800, Output: 350}
	writes := map[string]func(i int) error{
		"script": func(i int) error {
			return tally.RecordCallWith(ctx, fmt.Sprintf("r_bench_script_%d", i%1024), int64(i+1), u, 4321, false, nil, nil)
		},
		"hset": func(i int) error {
			key := keys.Usage(fmt.Sprintf("r_bench_hset_%d", i%1024))
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, key)
				p.HSet(ctx, key, "in_tok", u.Input, "cache_read_tok", u.CacheRead, "cache_write_tok", u.CacheWrite,
					"out_tok", u.Output, "cost_micro", 4321, "calls", 1)
				p.Expire(ctx, key, time.Hour)
				return nil
			})
			return err
		},
	}
	for _, name := range []string{"script", "hset"} {
		b.Run(name, func(b *testing.B) {
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			for i := range b.N {
				if err := writes[name](i); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(execMicros(b, rdb)/float64(b.N), "server-µs/op")
		})
	}
	// Both in turn, each write timed: a box whose load comes and goes weighs on both alike,
	// and the medians leave out the writes a descheduled process held up.
	b.Run("interleaved", func(b *testing.B) {
		took := map[string][]time.Duration{}
		for i := range b.N {
			for _, name := range []string{"script", "hset"} {
				start := time.Now()
				if err := writes[name](i); err != nil {
					b.Fatal(err)
				}
				took[name] = append(took[name], time.Since(start))
			}
		}
		for name, ds := range took {
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), name+"-p50-µs")
			b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds()), name+"-p90-µs")
		}
	})
}

// execMicros is the time Redis says it spent in EXEC since its stats were reset: the
// transactions' whole work, the commands and scripts they ran included.
func execMicros(b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		stats, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_exec:")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				n, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("commandstats %q: %v", line, err)
				}
				return n
			}
		}
	}
	b.Fatal("no EXEC in INFO commandstats")
	return 0
}
