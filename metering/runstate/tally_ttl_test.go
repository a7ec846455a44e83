package runstate_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestTallyLapsesAfterItsTTL: every call's tally write gives the run's hash the tally TTL (long
// past any hold's expiry), so it lapses once no reconciler can need it: without it a tally
// stayed for good, one hash per run, until a Redis that refuses writes when full (the
// configuration the gateway asks for) refused every call's.
func TestTallyLapsesAfterItsTTL(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	const ttl = time.Hour
	tally := runstate.NewTally(rdb, keys, ttl)
	ctx := context.Background()
	const run = "r_tally_lapses"
	if err := tally.Add(ctx, run, pricing.Usage{Input: 10, Output: 5}, 70, false); err != nil {
		t.Fatal(err)
	}
	if got := rdb.PTTL(ctx, keys.Usage(run)).Val(); got <= 0 || got > ttl {
		t.Fatalf("the tally lives %v; want it to lapse within the tally TTL (%v)", got, ttl)
	}
}

// TestTallyAgeIsSinceItsLastWrite: GetAged tells how long ago a tally was last written — a
// one-call run's by the write's time stored in it (Redis's clock), a named run's by what is
// left of its TTL, which every write that changes the tally gives whole: the reconciler's
// revisit of a run charged its hold waits for its call's tally to stand still (the final
// event's figures may yet be set right). A one-call run's write that changes nothing (an
// earlier try, landing late) leaves the age as it was. A one-call run's tally without a write
// time (an older gateway's) is aged by its TTL too, and is old without one.
func TestTallyAgeIsSinceItsLastWrite(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	const ttl, aged = time.Hour, 20 * time.Minute
	tally := runstate.NewTally(rdb, keys, ttl)
	ctx := context.Background()
	age := func(run string) time.Duration {
		t.Helper()
		_, age, found, err := tally.GetAged(ctx, run)
		if err != nil || !found {
			t.Fatalf("tally of %s: found %v, %v", run, found, err)
		}
		return age
	}
	// byTime sets a one-call run's write time aged back, as Redis's clock had it; byTTL its TTL
	// run down by aged.
	byTime := func(run string) {
		t.Helper()
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.HSet(ctx, keys.Usage(run), "write_ms", now.Add(-aged).UnixMilli()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	byTTL := func(run string) {
		t.Helper()
		if err := rdb.PExpire(ctx, keys.Usage(run), ttl-aged).Err(); err != nil {
			t.Fatal(err)
		}
	}
	u := pricing.Usage{Input: 10, Output: 5}
	for _, c := range []struct {
		what         string
		first, again func(run string) error
		setBack      func(run string)
	}{
		{"a one-call run's figures, set again", func(run string) error { return tally.RecordCallWith(ctx, run, 1, u, 70, false, nil, nil) },
			func(run string) error { return tally.RecordCallWith(ctx, run, 2, u, 90, false, nil, nil) }, byTime},
		{"a named run's calls", func(run string) error { return tally.Add(ctx, run, u, 70, false) },
			func(run string) error { return tally.Add(ctx, run, u, 70, false) }, byTTL},
		{"a call that used nothing", func(run string) error { return tally.MarkUnused(ctx, run) },
			func(run string) error { return tally.MarkUnused(ctx, run) }, byTime},
	} {
		run := "r_age_" + strings.ReplaceAll(c.what, " ", "_")
		if err := c.first(run); err != nil {
			t.Fatal(err)
		}
		if a := age(run); a < 0 || a >= aged {
			t.Fatalf("%s: written just now, aged %v", c.what, a)
		}
		c.setBack(run)
		if a := age(run); a < aged || a > ttl {
			t.Fatalf("%s: written %v ago, aged %v; want at least %v", c.what, aged, a, aged)
		}
		if err := c.again(run); err != nil {
			t.Fatal(err)
		}
		if a := age(run); a >= aged {
			t.Fatalf("%s: written again, aged %v; want the age of that write", c.what, a)
		}
	}

	const late = "r_age_late_try"
	if err := tally.RecordCallWith(ctx, late, 2, u, 90, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	byTime(late)
	if err := tally.RecordCallWith(ctx, late, 1, u, 70, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	if a := age(late); a < aged {
		t.Fatalf("an earlier try landing late, which changes nothing, made the tally %v old; want it as old as it was (%v or more)", a, aged)
	}

	const older = "r_age_older_gateway"
	if err := rdb.HSet(ctx, keys.Usage(older), "in_tok", 10, "out_tok", 5, "cost_micro", 70, "calls", 1).Err(); err != nil {
		t.Fatal(err)
	}
	byTTL(older)
	if a := age(older); a < aged || a > ttl {
		t.Fatalf("an older gateway's tally (no write time) with %v of its TTL left aged %v; want %v", ttl-aged, a, aged)
	}
	if err := rdb.Persist(ctx, keys.Usage(older)).Err(); err != nil {
		t.Fatal(err)
	}
	if a := age(older); a < ttl {
		t.Fatalf("an older gateway's tally without a TTL aged %v; want it old (%v or more)", a, ttl)
	}
}

// TestTallyWrittenDuringItsAgedReadIsNotOld: GetAged's figures and TTL go in one pipeline, not
// one transaction: another client's write may land between them. The figures are read first,
// so a tally written in between is read as none, or young; its TTL read first, a tally that did
// not exist yet (PTTL -2, older than any) was then found, with the age of none: the call's
// final event's figures, just written by a live process, read as a tally that stands still.
func TestTallyWrittenDuringItsAgedReadIsNotOld(t *testing.T) {
	base, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := context.Background()
	const run = "r_written_between"
	writer := runstate.NewTally(base, keys, time.Hour)
	rdb := redis.NewClient(base.Options())
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(writeBetween{write: func() {
		if err := writer.RecordCallWith(ctx, run, 1, pricing.Usage{Input: 10, Output: 5}, 70, false, nil, nil); err != nil {
			t.Error(err)
		}
	}})
	_, age, found, err := runstate.NewTally(rdb, keys, time.Hour).GetAged(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if found && age >= time.Minute {
		t.Fatalf("a tally written between the read's commands read as %v old; want it not found, or young", age)
	}
}

// writeBetween sends a pipeline's commands one at a time and calls write after the first.
type writeBetween struct{ write func() }

func (writeBetween) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (writeBetween) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h writeBetween) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for i := range cmds {
			if err := next(ctx, cmds[i:i+1]); err != nil {
				return err
			}
			if i == 0 {
				h.write()
			}
		}
		return nil
	}
}
