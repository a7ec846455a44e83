package runstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/pricing"
)

// Tally is the Redis record of what each run used, written after every call. It is evidence
// for the reconciler when a process dies before settling, not the ledger: settlement uses the
// process's own figures, and a failed tally write never fails a call.
type Tally struct {
	rdb  redis.UniversalClient
	keys Keys
	ttl  time.Duration
}

// NewTally wires a tally whose hashes live for ttl (48 h: long past any hold's expiry).
func NewTally(rdb redis.UniversalClient, keys Keys, ttl time.Duration) *Tally {
	if ttl <= 0 {
		panic("runstate: tally without TTL")
	}
	return &Tally{rdb: rdb, keys: keys, ttl: ttl}
}

// Add records one call in one MULTI/EXEC: integer HINCRBYs (no float drift) and the TTL, so
// a reader never sees half a call. estimated says the call was charged the gateway's estimate
// (no usage report): the reconciler that settles the run from this tally marks the run so, as
// the call's own settlement would have. A figure of 0 past the ones always written is left out.
func (t *Tally) Add(ctx context.Context, runID string, u pricing.Usage, costMicro int64, estimated bool) error {
	key := t.keys.Usage(runID)
	var est int64
	if estimated {
		est = 1
	}
	_, err := t.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, n := range usageArgs(u, costMicro, est) {
			if i >= alwaysWritten && n.(int64) == 0 {
				continue
			}
			p.HIncrBy(ctx, key, usageFields[i], n.(int64))
		}
		p.HIncrBy(ctx, key, "calls", 1)
		p.Expire(ctx, key, t.ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("tally %s: %w", runID, err)
	}
	return nil
}

// RecordCallWith is Add for a run of one call (a call that is no named run's): it sets the
// call's figures rather than adding them (integers still: one script that empties the tally and
// writes them in one HSET), so that the write sent again — a try after a failed one, which may
// have landed unanswered, or reaches Redis late, after the try that followed it — counts the
// call once whichever lands last, and holds that write's figures alone: a figure that write
// leaves out as 0 (its estimated mark, a part of the totals) or prices it does not carry
// (snapshot, empty for none) are not the earlier write's, left standing.
//
// seq is the write's place among its call's writes (1, 2, ...; each try a number of its own):
// the tally keeps it (recordSeqField), and a write whose seq is not above the kept one changes
// nothing. A write that reaches Redis late, after a later one (its MULTI/EXEC held up in the
// network past the client's read timeout), thus cannot put back the figures the later one
// replaced: the final event's, say, over a usage report's that came after it, from which the
// reconciler then settled the call should its settlement fail too. The test is in the script,
// in the same round trip, not a read ahead of it.
//
// A call's tally that fails is so tried again until the call's settlement applies: written once
// and given up, a call whose settlement failed too (the database out of reach) was charged its
// hold by the reconciler, though Redis was back long before. Only for a run whose one call is
// its one writer of figures (a zero tally, MarkUnused, adds none), and with's commands must not
// write the tally: the script empties it after them.
func (t *Tally) RecordCallWith(ctx context.Context, runID string, seq int64, u pricing.Usage, costMicro int64, estimated bool,
	snapshot []byte, with func(redis.Pipeliner)) error {
	if seq <= 0 {
		panic(fmt.Sprintf("runstate: a call's tally write numbered %d", seq))
	}
	key := t.keys.Usage(runID)
	args := append([]any{t.ttl.Milliseconds(), seq}, recordValues(u, costMicro, estimated, snapshot)...)
	_, err := t.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		if with != nil {
			with(p)
		}
		p.Eval(ctx, recordCallLua, []string{key}, args...)
		return nil
	})
	if err != nil {
		return fmt.Errorf("tally %s (write %d): %w", runID, seq, err)
	}
	return nil
}

// recordSeqField holds the seq of the last of a one-call run's writes the tally took
// (RecordCallWith). Not a figure: Get does not read it.
const recordSeqField = "write_seq"

// writeTimeField holds when a one-call run's tally was last written (RecordCallWith,
// MarkUnused), in ms of Redis's clock (TIME, read by the script that writes the figures): its
// age (GetAged) is then the same whatever tally_ttl the writer and the reader were given, and
// no process's clock enters it. Not a figure: an older gateway's reader passes over it.
const writeTimeField = "write_ms"

// nowMsLua is Redis's clock in ms, as a script's local now.
const nowMsLua = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

// recordCallLua: KEYS usage; ARGV tally ttl ms, the write's seq, then the tally's field-value
// pairs (recordValues). Unless the tally holds a write of a seq as high, empties it and sets
// the pairs, the seq and the write's time (writeTimeField); returns 1 if it did. A tally that is no hash, or whose seq is no
// number (written by hand, or by a gateway of before the seqs), is overwritten, as an HSET on
// an emptied key was. Kept short and plain: it goes whole with every plain call's tally (EVAL
// in a MULTI/EXEC, where an EVALSHA the server lacks fails alone, after the commands beside it
// ran), and it runs on the final event's path.
var recordCallLua = `
local held = tonumber(redis.pcall('HGET', KEYS[1], '` + recordSeqField + `'))
if held and held >= tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1])
` + nowMsLua + `redis.call('HSET', KEYS[1], '` + recordSeqField + `', ARGV[2], '` + writeTimeField + `', now, unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`

// recordValues are a one-call run's tally as field-value pairs: its figures (a figure of 0 past
// the ones always written left out), one call, and the prices when there are some.
func recordValues(u pricing.Usage, costMicro int64, estimated bool, snapshot []byte) []any {
	var est int64
	if estimated {
		est = 1
	}
	values := make([]any, 0, 2*(len(usageFields)+2))
	for i, n := range usageArgs(u, costMicro, est) {
		if i >= alwaysWritten && n.(int64) == 0 {
			continue
		}
		values = append(values, usageFields[i], n)
	}
	values = append(values, "calls", 1)
	if len(snapshot) > 0 {
		values = append(values, snapshotField, snapshot)
	}
	return values
}

// MarkUnused records that a run used nothing, as evidence for the reconciler: a run with a
// tally is settled by it (here at 0), one without is charged what it held. It is a write of
// the tally: it stamps its time (writeTimeField) and gives it the whole ttl.
func (t *Tally) MarkUnused(ctx context.Context, runID string) error {
	return t.markUnused(ctx, runID, "", false)
}

// MarkRunCallUnused is MarkUnused for an ended call of a named run that used nothing (refused
// before its reservation), which its run's row records among its ended calls: the tally counts
// it there too (Tallied.Ended). Sent again after a lost reply it may count the call twice,
// which only makes the tally look more whole than the row, never less.
func (t *Tally) MarkRunCallUnused(ctx context.Context, runID string) error {
	return t.markUnused(ctx, runID, "", true)
}

// MarkCallUnused is MarkUnused for a run of one call whose settlement source (holds'
// Settlement.Source: release, duplicate, upstream_error, ...) says why it used nothing: the
// tally keeps it (Tallied.Source), so that a reconciler's pass that gives back a charge its
// hold took before the call settled (holds' revisit) can say, as the call's own refund does,
// whether the call answered nothing — which an Idempotency-Key's retry reads once Redis lost
// the key's record. "" keeps none. Not for a named run: its tally is many calls'.
func (t *Tally) MarkCallUnused(ctx context.Context, runID, source string) error {
	return t.markUnused(ctx, runID, source, false)
}

// markUnused is MarkCallUnused; ended counts a named run's call among its ended calls
// (Tallied.Ended).
func (t *Tally) markUnused(ctx context.Context, runID, source string, ended bool) error {
	count := 0
	if ended {
		count = 1
	}
	if err := markUnusedScript.Run(ctx, t.rdb, []string{t.keys.Usage(runID)}, t.ttl.Milliseconds(), source, count).Err(); err != nil {
		return fmt.Errorf("tally %s as unused: %w", runID, err)
	}
	return nil
}

// markUnusedScript: KEYS usage; ARGV tally ttl ms, the settlement's source ("" for none), the
// ended calls to count (1 for a named run's call, else 0). A
// zero cost (a figure already there is left as it is), the source, the write's time, the TTL:
// one script, so the time is Redis's and the tally never holds one without the other.
var markUnusedScript = redis.NewScript(`
redis.call('HINCRBY', KEYS[1], 'cost_micro', 0)
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], '` + sourceField + `', ARGV[2]) end
if ARGV[3] ~= '0' then redis.call('HINCRBY', KEYS[1], '` + endedField + `', ARGV[3]) end
` + nowMsLua + `redis.call('HSET', KEYS[1], '` + writeTimeField + `', now)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`)

// sourceField holds a one-call run's settlement source, when its call's zero tally was written
// with one (MarkCallUnused). Not a figure: an older gateway's reader passes over it.
const sourceField = "settle_source"

// MarkRefused records that the admission of runID carrying token was refused (its outcome
// unknown: the COMMIT sent, its reply lost) and never forwarded. The reconciler reads it
// (Refused) for a hold with no tally: a hold carrying that token was inserted by the refused
// request itself, which is the only one that forwards on it (a run that is not a named run),
// so it used nothing. It is a mark of its own, not a zero tally: the run id of an
// Idempotency-Key attempt may be held by another request of the key that did forward (if this
// admission never committed), and a zero tally on it would settle that call at 0.
func (t *Tally) MarkRefused(ctx context.Context, runID, token string) error {
	if token == "" {
		panic("runstate: refused admission without a token")
	}
	key := t.keys.Refused(runID)
	_, err := t.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, token, 1)
		p.Expire(ctx, key, t.ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("mark admission of %s refused: %w", runID, err)
	}
	return nil
}

// Refused reports whether the admission of runID carrying token was marked refused
// (MarkRefused). Marks that are no hash are an error wrapping ErrTallyCorrupt.
func (t *Tally) Refused(ctx context.Context, runID, token string) (bool, error) {
	ok, err := t.rdb.HExists(ctx, t.keys.Refused(runID), token).Result()
	if isWrongType(err) {
		return false, fmt.Errorf("read refused admissions of %s: %w: %w", runID, ErrTallyCorrupt, err)
	}
	if err != nil {
		return false, fmt.Errorf("read refused admissions of %s: %w", runID, err)
	}
	return ok, nil
}

// Tallied is a run's tally.
type Tallied struct {
	Usage     pricing.Usage
	CostMicro int64
	Calls     int64
	// EstimatedCalls counts the calls charged an estimate. A tally written before the field
	// existed has none: its runs settle unmarked, as they did.
	EstimatedCalls int64
	// PriceSnapshot is the snapshot of the prices a one-call run's call was billed at, when
	// they are not those its hold recorded at admission (another model answered it):
	// RecordCallWith's snapshot. "" when the hold's own explain its cost. A string, so that a Tallied
	// compares.
	PriceSnapshot string
	// Source is the settlement source a one-call run's call that used nothing was settled as
	// (MarkCallUnused): "" when its tally does not say (figures set since, a named run's, or
	// one written by a gateway of before the field).
	Source string
	// Ended counts the ended calls of a named run its tally has, those that used nothing
	// included (RunBudget's release, MarkUnused), as its row's ended_calls does; EndedKnown is
	// false for a tally without the field (one-call runs', and those written only by a gateway
	// of before it). A row that records more ended calls than the tally has lost some to a
	// Redis restart, though they cost nothing.
	Ended      int64
	EndedKnown bool
}

// ErrTallyCorrupt is a tally that was read but is no record of usage: a field that is no
// integer (or past int64), or a key that is no hash. Written so only by hand or by a foreign
// tool, never by the gateway; unlike a failed read, asking again changes nothing.
var ErrTallyCorrupt = errors.New("tally is no record of usage")

// Get reads a run's tally; found is false when there is none. A tally that is no record of
// usage is an error wrapping ErrTallyCorrupt.
func (t *Tally) Get(ctx context.Context, runID string) (Tallied, bool, error) {
	tl, _, found, err := t.GetAged(ctx, runID)
	return tl, found, err
}

// GetAged is Get with how long ago the tally was last written, so the reconciler can tell a
// tally its call's process may still be setting right (the final event's figures, then the
// usage reported after it) from one that stands still. A one-call run's tally holds its last
// write's time (writeTimeField, Redis's clock: RecordCallWith, MarkUnused), and its age is
// Redis's clock now, read on the tally's own server in the same round trip, less that: the
// same whatever tally_ttl the writer had. A tally without one — a named run's (Add, RunBudget's
// release), or a one-call run's written by a gateway of before the field, during a rolling
// upgrade — is aged by its TTL run down, t's ttl less what is left of it (every write gives it
// the whole ttl): one from a gateway with another tally_ttl looks younger (a longer one) or
// older (a shorter one) by the difference, and one without a TTL (written by hand, or
// PERSISTed) is as old as t's ttl and more.
func (t *Tally) GetAged(ctx context.Context, runID string) (tl Tallied, age time.Duration, found bool, err error) {
	key := t.keys.Usage(runID)
	var read *redis.SliceCmd
	var left *redis.DurationCmd
	var now *redis.Cmd
	_, err = t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		read, left = p.HMGet(ctx, key, readFields...), p.PTTL(ctx, key)
		now = p.Eval(ctx, clockLua, []string{key})
		return nil
	})
	if isWrongType(err) {
		return Tallied{}, 0, false, fmt.Errorf("read tally %s: %w: %w", runID, ErrTallyCorrupt, err)
	}
	if err != nil {
		return Tallied{}, 0, false, fmt.Errorf("read tally %s: %w", runID, err)
	}
	// PTTL answers -1 (no TTL) in its own unit, a nanosecond here: older than ttl.
	age = t.ttl - left.Val()
	vals := read.Val()
	m := make(map[string]string, len(tallyFields))
	var snapshot, written, source, ended string
	for i, v := range vals {
		if s, ok := v.(string); ok {
			switch i {
			case len(tallyFields):
				snapshot = s
			case len(tallyFields) + 1:
				written = s
			case len(tallyFields) + 2:
				source = s
			case len(tallyFields) + 3:
				ended = s
			default:
				m[tallyFields[i]] = s
			}
		}
	}
	if len(m) == 0 {
		return Tallied{}, 0, false, nil
	}
	var parseErr error
	field := func(name string) int64 {
		v, err := strconv.ParseInt(m[name], 10, 64)
		if err != nil && m[name] != "" {
			parseErr = errors.Join(parseErr, fmt.Errorf("field %s: %w", name, err))
		}
		return v
	}
	out := Tallied{
		Usage: pricing.Usage{Input: field("in_tok"), CacheRead: field("cache_read_tok"),
			CacheWrite: field("cache_write_tok"), Output: field("out_tok"), CacheWrite1h: field("cache_write_1h_tok"),
			AudioInput: field("audio_in_tok"), AudioOutput: field("audio_out_tok")},
		CostMicro:      field("cost_micro"),
		Calls:          field("calls"),
		EstimatedCalls: field("est_calls"),
		PriceSnapshot:  snapshot,
		Source:         source,
	}
	if ended != "" {
		n, err := strconv.ParseInt(ended, 10, 64)
		if err != nil {
			parseErr = errors.Join(parseErr, fmt.Errorf("field %s: %w", endedField, err))
		}
		out.Ended, out.EndedKnown = n, true
	}
	if written != "" {
		age, err = writtenAgo(written, now)
		if err != nil {
			parseErr = errors.Join(parseErr, err)
		}
	}
	if parseErr != nil {
		return Tallied{}, 0, false, fmt.Errorf("read tally %s: %w: %w", runID, ErrTallyCorrupt, parseErr)
	}
	return out, age, true, nil
}

// clockLua answers Redis's clock in ms. Sent with the tally's key, it runs on the server that
// holds the tally (a Cluster's node of its slot), whose clock stamped the write.
const clockLua = nowMsLua + "return now"

// writtenAgo is how long before now (clockLua's answer) a tally's write time (writeTimeField)
// was. A time that is no integer is a tally written by hand; one ahead of now (a failover to a
// server whose clock is behind) is a tally just written.
func writtenAgo(written string, now *redis.Cmd) (time.Duration, error) {
	at, err := strconv.ParseInt(written, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("field %s: %w", writeTimeField, err)
	}
	nowMs, err := now.Int64()
	if err != nil {
		return 0, fmt.Errorf("redis clock: %w", err)
	}
	return time.Duration(max(0, nowMs-at)) * time.Millisecond, nil
}

// isWrongType reports whether err is Redis's refusal of a command on a key of another type.
func isWrongType(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE")
}

// JoinsAdd reports whether commands on keys through rdb may ride in RecordCallWith's MULTI/EXEC for
// runID: the tally is written through rdb, and the keys may share a transaction with the
// run's tally (oneTransaction: on a Cluster client, only in its hash slot).
func (t *Tally) JoinsAdd(rdb redis.UniversalClient, runID string, keys ...string) bool {
	return t.rdb == rdb && oneTransaction(rdb, append([]string{t.keys.Usage(runID)}, keys...)...)
}

// usageFields are the figures one call adds to its run's tally hash, in usageArgs' order. The
// first alwaysWritten are written by every call; the estimated mark and the parts of the
// totals (one-hour cache writes, audio in and out) only when there is one to count, so a text
// call's tally costs no more commands for them. One list, read by Add, RecordCallWith and the run
// budget's Release alike, so that they cannot spell a field apart.
var usageFields = [...]string{"in_tok", "cache_read_tok", "cache_write_tok", "out_tok", "cost_micro",
	"est_calls", "cache_write_1h_tok", "audio_in_tok", "audio_out_tok"}

const alwaysWritten = 5

// usageArgs are one call's figures in usageFields' order, as script arguments.
func usageArgs(u pricing.Usage, costMicro, estCalls int64) []any {
	return []any{u.Input, u.CacheRead, u.CacheWrite, u.Output, costMicro, estCalls, u.CacheWrite1h, u.AudioInput, u.AudioOutput}
}

// usageLua is the Lua that adds usageArgs, found from ARGV[from] on, to the hash KEYS[1].
func usageLua(from int) string {
	var b strings.Builder
	for i, f := range usageFields {
		arg := "ARGV[" + strconv.Itoa(from+i) + "]"
		if i < alwaysWritten {
			b.WriteString("redis.call('HINCRBY', KEYS[1], '" + f + "', " + arg + ")\n")
		} else {
			b.WriteString("if " + arg + " ~= '0' then redis.call('HINCRBY', KEYS[1], '" + f + "', " + arg + ") end\n")
		}
	}
	return b.String()
}

// tallyFields are the figures of a tally hash, all it holds (a named run's calls are marked
// tallied in keys of their own, Keys.CallDone).
var tallyFields = append([]string{"calls"}, usageFields[:]...)

// snapshotField holds a tally's PriceSnapshot, when its call wrote one.
const snapshotField = "price_snapshot"

// readFields are what Get reads: the figures, then the snapshot, the write's time, the
// settlement's source and the ended calls.
var readFields = append(slices.Clone(tallyFields), snapshotField, writeTimeField, sourceField, endedField)

// endedField counts a named run's ended calls (Tallied.Ended). Not a figure: an older
// gateway's reader passes over it.
const endedField = "ended"
