package holds

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// RedisPrefix is the redis_key_prefix the fleet's gateways name their Redis keys under (a run's
// tally and lease, the reconcile lock), as the gateway that set it recorded it (table
// redis_prefix, one row). `gateway reconcile -once` reads those keys under its own config's
// prefix: run with another (none, or a stale TOLLGATE_REDIS_PREFIX) it found no tally and no
// lease, and charged live calls, and calls whose tally said less, their whole holds, with
// nothing to tell. The record is what it compares its prefix with.
//
// Like CreditUnit, only `gateway serve` writes it, and a serve whose prefix differs is refused
// unless told the change is meant (RecordRedisPrefix's change): beside the fleet, its
// reconciler would find none of the others' leases and tallies and charge their calls whole.
type RedisPrefix struct {
	Prefix string
	SetBy  string // the instance name of the gateway that recorded it
	SetAt  time.Time
}

// ErrNoRedisPrefix is a database no gateway of this version has served yet: nothing says under
// which prefix the fleet's Redis keys are.
var ErrNoRedisPrefix = errors.New("no redis_key_prefix is recorded in the database: no gateway of this version has served it yet")

// RedisPrefixMismatchError is a config whose redis_key_prefix is not the one recorded.
type RedisPrefixMismatchError struct {
	Recorded RedisPrefix
	Config   string // the prefix of the config compared
}

func (e *RedisPrefixMismatchError) Error() string {
	return fmt.Sprintf("this config's redis_key_prefix (TOLLGATE_REDIS_PREFIX) is %q but the fleet's Redis keys are under %q (recorded by gateway %s at %s)",
		e.Config, e.Recorded.Prefix, e.Recorded.SetBy, e.Recorded.SetAt.UTC().Format(time.RFC3339))
}

// redisPrefixRecord is where serve records the fleet's Redis key prefix.
var redisPrefixRecord = fleetRecord{table: "redis_prefix", column: "prefix"}

func redisPrefixOf(r recorded[string]) RedisPrefix {
	return RedisPrefix{Prefix: r.Value, SetBy: r.SetBy, SetAt: r.SetAt}
}

// CheckRedisPrefix refuses prefix unless it is the recorded one: ErrNoRedisPrefix, or a
// *RedisPrefixMismatchError.
func (s *Store) CheckRedisPrefix(ctx context.Context, prefix string) error {
	rec, found, err := readRecord[string](ctx, s, redisPrefixRecord)
	if err != nil {
		return err
	}
	if !found {
		return ErrNoRedisPrefix
	}
	if rec.Value != prefix {
		return &RedisPrefixMismatchError{Recorded: redisPrefixOf(rec), Config: prefix}
	}
	return nil
}

// RecordRedisPrefix records prefix, set by the instance named by, as the fleet's when none is
// recorded, and returns what was recorded before (found false if nothing). When another is
// recorded it answers a *RedisPrefixMismatchError and changes nothing, unless change is set:
// then it records prefix in its place.
func (s *Store) RecordRedisPrefix(ctx context.Context, prefix, by string, change bool) (prev RedisPrefix, found bool, err error) {
	rec, found, err := writeRecord(ctx, s, redisPrefixRecord, prefix, by, func(cur recorded[string]) (bool, error) {
		if cur.Value == prefix {
			return false, nil
		}
		if !change {
			return false, &RedisPrefixMismatchError{Recorded: redisPrefixOf(cur), Config: prefix}
		}
		return true, nil
	})
	if !found {
		return RedisPrefix{}, false, err
	}
	return redisPrefixOf(rec), true, err
}

// LongestTTL is the longest value of a Redis TTL setting any gateway has served with, and the
// gateway that recorded it (tables longest_tally_ttl, longest_replay_ttl, one row each). A key
// a gateway wrote lives its TTL whatever the others run with, and after that gateway stops:
// `gateway prune`, which must not delete a run while its tally (holds.tally_ttl) or an
// Idempotency-Key's record of it (dedup.replay_ttl) may still be in Redis, bounded its cutoff
// by its own config's values, and given shorter ones than the gateways' pruned runs that a
// replay or a run's id sent again still read. The record is never lowered by a serve: a
// shorter TTL takes over only once the keys of the longer are gone, which the database cannot
// see.
type LongestTTL struct {
	TTL   time.Duration
	SetBy string // the instance name of the gateway that served with it
	SetAt time.Time
}

// The records of the longest TTLs, in milliseconds.
var (
	longestTallyTTLRecord  = fleetRecord{table: "longest_tally_ttl", column: "tally_ttl_ms"}
	longestReplayTTLRecord = fleetRecord{table: "longest_replay_ttl", column: "replay_ttl_ms"}
)

// ErrNoLongestTTLs is a database no gateway of this version has served yet: nothing says how
// long the fleet's Redis keeps a run's tally or an Idempotency-Key's record.
var ErrNoLongestTTLs = errors.New("no tally_ttl or replay_ttl is recorded in the database: no gateway of this version has served it yet")

// LongestTTLs reads the longest holds.tally_ttl and dedup.replay_ttl recorded,
// ErrNoLongestTTLs if either is not.
func (s *Store) LongestTTLs(ctx context.Context) (tally, replay LongestTTL, err error) {
	for _, r := range []struct {
		rec fleetRecord
		out *LongestTTL
	}{{longestTallyTTLRecord, &tally}, {longestReplayTTLRecord, &replay}} {
		rec, found, err := readRecord[int64](ctx, s, r.rec)
		if err != nil {
			return LongestTTL{}, LongestTTL{}, err
		}
		if !found {
			return LongestTTL{}, LongestTTL{}, ErrNoLongestTTLs
		}
		*r.out = LongestTTL{TTL: time.Duration(rec.Value) * time.Millisecond, SetBy: rec.SetBy, SetAt: rec.SetAt}
	}
	return tally, replay, nil
}

// RecordTTLs records tallyTTL and replayTTL, served with by the instance named by, each in
// place of the one recorded when longer (or none is), and reports which it raised.
func (s *Store) RecordTTLs(ctx context.Context, tallyTTL, replayTTL time.Duration, by string) (raisedTally, raisedReplay bool, err error) {
	raise := func(r fleetRecord, ttl time.Duration) (bool, error) {
		ms := ttl.Milliseconds()
		prev, found, err := writeRecord(ctx, s, r, ms, by, func(cur recorded[int64]) (bool, error) { return ms > cur.Value, nil })
		if err != nil {
			return false, err
		}
		return !found || ms > prev.Value, nil
	}
	if raisedTally, err = raise(longestTallyTTLRecord, tallyTTL); err != nil {
		return false, false, err
	}
	raisedReplay, err = raise(longestReplayTTLRecord, replayTTL)
	return raisedTally, raisedReplay, err
}
