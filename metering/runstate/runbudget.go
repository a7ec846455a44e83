package runstate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// RunBudget shares a named run's cap between its calls (DESIGN §4). Calls of one run may run
// at once, on any process, and each is tallied only when it ends: checking "tallied cost +
// this call's worst case ≤ cap" against the tally alone would let k concurrent calls each
// spend the whole cap. So each call reserves its worst case before it is forwarded, against
// what the run has tallied plus what its calls in flight have reserved, and gives the
// reservation back in the same step that tallies its usage. The calls in flight are also what
// keeps a run from being settled under a running call (CloseRun).
//
// The reservations live in a hash next to the run's tally, in the same hash slot: one field per
// call in flight, c:<call id> = "<grant>:<last beat ms>", one per call tallied whose record on
// the run's row is still on its way, r:<call id> = "<ms>" (ReleaseBeforeRecord), and closed
// once the run is being settled. A field per call rather than counters makes every step safe to repeat (go-redis
// resends a script whose reply it lost): a repeated ReserveAtMost finds its field and returns its
// grant, and a repeated Release finds the call already tallied (its CallDone mark, a key that
// lives as long as the tally) and does nothing.
//
// The process serving a call beats its reservation (Refresh, every heartbeat interval), so a
// field not beaten for staleAfter (the lease TTL) belongs to a process that died mid-call, and
// is dropped. Dropped only once older than the longest call instead, a killed process's
// reservation kept the run's next calls at 402 and its settlement at 409 for minutes.
type RunBudget struct {
	rdb        redis.UniversalClient
	keys       Keys
	tallyTTL   time.Duration
	maxCall    time.Duration
	staleAfter time.Duration

	mu sync.Mutex
	// calls are the reservations this process may hold: the ones it beats. The value is true
	// once Refresh has reported the reservation lost: it is reported once, not at every beat
	// for the rest of its call.
	calls map[RunCallID]bool
}

// RunCallID names one call of a run.
type RunCallID struct{ Run, Call string }

// Errors of ReserveAtMost and CloseRun.
var (
	ErrRunBudget = errors.New("run budget exhausted")
	ErrRunClosed = errors.New("run is being settled")
	ErrRunBusy   = errors.New("calls of the run are in flight")
	// ErrRunCalls: the run already has as many calls in flight as it may.
	ErrRunCalls = errors.New("too many calls of the run in flight")
)

// MaxReservable bounds every figure a reservation computes with: Redis scripts count in
// doubles, exact to 2^53, and print integers past 1e14 in exponent form, which HINCRBY
// refuses. 2^46 micro-USD is about $70M, far past any cap.
const MaxReservable = 1 << 46

// NewRunBudget wires run budgets: tallyTTL is the tally's (see NewTally), maxCall the longest a
// call can run, staleAfter how long a reservation lives without its process's beat (Refresh);
// it must be well above the interval of the beat.
func NewRunBudget(rdb redis.UniversalClient, keys Keys, tallyTTL, maxCall, staleAfter time.Duration) *RunBudget {
	if tallyTTL <= 0 || maxCall <= 0 || staleAfter <= 0 {
		panic("runstate: run budget without TTLs")
	}
	return &RunBudget{rdb: rdb, keys: keys, tallyTTL: tallyTTL, maxCall: maxCall, staleAfter: staleAfter,
		calls: map[RunCallID]bool{}}
}

// liveCallsLua sums the grants of the calls in flight in the budget hash KEYS[2] and drops the
// fields of calls not beaten for ARGV[staleArg] ms. It sets now, reserved and inflight, and
// recording: the calls tallied whose record on the run's row has not landed yet (their
// r:<call id> = "<ms>" fields, see ReleaseBeforeRecord), dropped too once older than staleArg.
// It drops the reopens' marks (o:<mark> = "<ms>", reopenScript) once older than
// ARGV[maxCallArg] ms, the longest call: the hash lives as long as the run's calls go on, and
// kept every failed settlement's mark for as long.
const liveCallsLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reserved, inflight, recording = 0, 0, 0
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local kind = string.sub(all[i], 1, 2)
  if kind == 'c:' then
    local g, at = string.match(all[i + 1], '^(%d+):(%d+)$')
    if tonumber(at) + tonumber(ARGV[staleArg]) < now then
      redis.call('HDEL', KEYS[2], all[i])
    else
      reserved, inflight = reserved + tonumber(g), inflight + 1
    end
  elseif kind == 'r:' then
    if tonumber(all[i + 1]) + tonumber(ARGV[staleArg]) < now then
      redis.call('HDEL', KEYS[2], all[i])
    else
      recording = recording + 1
    end
  elseif kind == 'o:' then
    if tonumber(all[i + 1]) + tonumber(ARGV[maxCallArg]) < now then redis.call('HDEL', KEYS[2], all[i]) end
  end
end
`

// reserveScript: KEYS usage, budget hash, call's done mark; ARGV budget, want, least, call id,
// max call ms, max calls in flight (0: any number), stale ms, spent at least. A tally that
// costs less than the row recorded at the call's admission (spent at least) has lost calls:
// the budget hash's lost field says so to the calls' releases, which mark the run Lost
// (ReleaseBeforeRecord); the field gives the hash a call's life if it had none (a refusal
// after a Redis restart wrote it into no hash: one without a TTL, kept for good). Returns the
// grant, -1 when nothing or less than least is left, -2 when the run is closed, -3 when as many
// calls as it may have are in flight, -4 when the call has been released already: the
// reservation reached Redis after its call had ended (its request delayed on the network while
// go-redis resent it, or while the call gave up on it and released), and reserves nothing.
// Reserved, no process stamped it, and the run counted a call in flight for staleAfter: its
// settle refused 409 run_busy with nothing running, its next calls short of that much cap.
var reserveScript = redis.NewScript(`
local staleArg, maxCallArg = 7, 5
if redis.call('EXISTS', KEYS[3]) == 1 then return -4 end
if redis.call('HGET', KEYS[2], 'closed') then return -2 end
local field = 'c:' .. ARGV[4]
local mine = redis.call('HGET', KEYS[2], field)
if mine then return tonumber(string.match(mine, '^(%d+)')) end
` + liveCallsLua + `
local tallied = tonumber(redis.call('HGET', KEYS[1], 'cost_micro') or '0')
if tallied < tonumber(ARGV[8]) then
  redis.call('HSET', KEYS[2], 'lost', now)
  if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[maxCallArg]) then redis.call('PEXPIRE', KEYS[2], ARGV[maxCallArg]) end
end
if tonumber(ARGV[6]) > 0 and inflight >= tonumber(ARGV[6]) then return -3 end
local spent = math.max(tallied, tonumber(ARGV[8]))
local left = tonumber(ARGV[1]) - spent - reserved
if left <= 0 or left < tonumber(ARGV[3]) then return -1 end
local grant = math.min(tonumber(ARGV[2]), left)
redis.call('HSET', KEYS[2], field, string.format('%d:%d', grant, now))
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return grant`)

// ReserveAtMost takes up to want micro-USD (list price) of the run's budget for the call
// callID: budget minus what the run has tallied minus what its calls in flight have reserved.
// It fails with ErrRunBudget when nothing, or less than least (the call's cost without any
// output), is left, with ErrRunClosed once the run is being settled, and with ErrRunCalls when
// the run already has maxCalls calls in flight (0: any number): that bounds what one run's
// calls may run at once, and what every reservation of the run scans. spentAtLeast is what the
// run is known to have spent elsewhere (its row's record of its ended calls): the tally, which
// a Redis restart without persistence loses, counts as no less — without it such a restart
// gave the run's next calls its whole cap again. Figures past MaxReservable are taken as
// MaxReservable. A call that tried to reserve must Release, whatever this returned: a
// reservation whose reply was lost is still there.
func (b *RunBudget) ReserveAtMost(ctx context.Context, runID, callID string, budget, want, least int64, maxCalls int, spentAtLeast int64) (int64, error) {
	budget, want, least = min(budget, MaxReservable), min(want, MaxReservable), min(least, MaxReservable)
	spentAtLeast = max(0, min(spentAtLeast, MaxReservable))
	if want < least || least < 0 {
		panic(fmt.Sprintf("runstate: reserve want %d least %d", want, least))
	}
	// Beaten from now on: a reservation whose reply is lost may still have been made.
	rc := RunCallID{runID, callID}
	b.mu.Lock()
	b.calls[rc] = false
	b.mu.Unlock()
	grant, err := reserveScript.Run(ctx, b.rdb, []string{b.keys.Usage(runID), b.keys.RunBudget(runID), b.keys.CallDone(runID, callID)},
		budget, want, least, callID, b.maxCall.Milliseconds(), max(maxCalls, 0), b.staleAfter.Milliseconds(), spentAtLeast).Int64()
	if err == nil && grant < 0 {
		b.forget(rc) // refused: nothing was reserved
	}
	switch {
	case err != nil:
		return 0, fmt.Errorf("reserve for run %s: %w", runID, err)
	case grant == -1:
		return 0, ErrRunBudget
	case grant == -2:
		return 0, ErrRunClosed
	case grant == -3:
		return 0, ErrRunCalls
	case grant == -4:
		return 0, fmt.Errorf("reserve for run %s: call %s has ended", runID, callID)
	}
	return grant, nil
}

// releaseScript: KEYS usage, budget hash, call's done mark, the run's lost mark; ARGV call id,
// tally ttl ms, done mark ttl ms, calls, record to come (1 or 0), max call ms, then usageArgs.
// The first time only, with a record to come on a run whose record lost calls, the call's r:
// field says so until Recorded drops it. A call whose own reservation is gone when it is
// tallied (Redis lost the run's keys while it ran, or dropped it as stale), or whose run's
// budget hash has a reservation's finding of a short tally (its lost field, reserveScript),
// marks the run Lost first, as AwaitRebuild does: a tally started again after a loss may cost
// more than the row without having the row's calls. The script returns 2 while that field
// stands and a record is to come, the first time or a repeat: a repeat is most often go-redis
// resending a script whose reply it lost, and its caller must learn of the mark the first run
// set, or it never drops it and the run cannot be settled until the mark lapses. Else it
// returns 1.
var releaseScript = redis.NewScript(`
if redis.call('SET', KEYS[3], 1, 'NX', 'PX', ARGV[3]) then
redis.call('HINCRBY', KEYS[1], 'calls', ARGV[4])
redis.call('HINCRBY', KEYS[1], '` + endedField + `', 1)
` + usageLua(7) + `
local marked = 1
if ARGV[5] == '1' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if redis.call('HEXISTS', KEYS[2], 'c:' .. ARGV[1]) == 0 or redis.call('HEXISTS', KEYS[2], 'lost') == 1 then
    redis.call('SET', KEYS[4], now, 'NX', 'PX', ARGV[2])
  end
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('HSET', KEYS[2], 'r:' .. ARGV[1], now)
    if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[6]) then redis.call('PEXPIRE', KEYS[2], ARGV[6]) end
    marked = 2
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[2], 'c:' .. ARGV[1])
return marked
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[2], 'c:' .. ARGV[1])
if ARGV[5] == '1' and redis.call('HEXISTS', KEYS[2], 'r:' .. ARGV[1]) == 1 then return 2 end
return 1`)

// Release tallies the call callID and gives back its reservation in one step, so the call's
// cost is never counted twice against the budget nor missing from it; repeated, it changes
// nothing. A call that used nothing still leaves the tally, as evidence for the reconciler
// (see Tally.MarkUnused), but does not count as a call.
func (b *RunBudget) Release(ctx context.Context, runID, callID string, u pricing.Usage, costMicro int64, estimated bool) error {
	_, err := b.release(ctx, runID, callID, u, costMicro, estimated, false)
	return err
}

// ReleaseBeforeRecord is Release for a call whose record on the run's row is still to be
// written. For a run whose Redis record is known to have lost calls (Lost, set by
// AwaitRebuild, or by this release when the call's own reservation is gone or a reservation
// of the run found its tally short of the row's record), it marks the call so that until
// Recorded says it has been recorded, CloseRun finds it in flight, and reports marked (a
// repeat reports the mark too while it stands).
// Without it a settlement that came between the two writes found nothing in flight and charged
// the larger of the tally, which had the call, and the row, which had not — after a Redis
// restart without persistence, when the tally holds only the calls made since, one of the two
// records alone — and the call's record then found its run settled. A run whose record is
// whole needs no mark: its tally, with the call, is the larger record. A loss is not always
// seen by the settlement (a tally of the calls since, costing more than the row's calls before,
// looks whole): the run's calls mark it when their reservation finds the tally short of the row,
// or their release finds their reservation gone.
func (b *RunBudget) ReleaseBeforeRecord(ctx context.Context, runID, callID string, u pricing.Usage, costMicro int64, estimated bool) (marked bool, err error) {
	return b.release(ctx, runID, callID, u, costMicro, estimated, true)
}

// recordedScript: KEYS budget hash; ARGV call id.
var recordedScript = redis.NewScript(`return redis.call('HDEL', KEYS[1], 'r:' .. ARGV[1])`)

// Recorded says that the call callID, released with ReleaseBeforeRecord, has been recorded on
// its run's row (or will not be: its record failed): the run may be settled. A mark it fails
// to drop keeps the run's settlement busy for staleAfter.
func (b *RunBudget) Recorded(ctx context.Context, runID, callID string) error {
	if err := recordedScript.Run(ctx, b.rdb, []string{b.keys.RunBudget(runID)}, callID).Err(); err != nil {
		return fmt.Errorf("mark call of run %s recorded: %w", runID, err)
	}
	return nil
}

func (b *RunBudget) release(ctx context.Context, runID, callID string, u pricing.Usage, costMicro int64, estimated, toRecord bool) (marked bool, err error) {
	// No longer beaten, whatever the outcome: a field a failed release leaves behind goes stale.
	b.forget(RunCallID{runID, callID})
	calls, est := 1, int64(0)
	if costMicro == 0 && u == (pricing.Usage{}) {
		calls = 0
	} else if estimated {
		est = 1
	}
	// The done mark lives as long as the tally it guards: a repeat of this Release (a resent
	// script, the call's tally retries after a lost reply, however long the answer took to
	// write) finds it whenever it finds the tally. One key per call for tally_ttl, as a
	// one-call run's tally is.
	record := 0
	if toRecord {
		record = 1
	}
	args := append([]any{callID, b.tallyTTL.Milliseconds(), b.tallyTTL.Milliseconds(), calls, record, b.maxCall.Milliseconds()},
		usageArgs(u, costMicro, est)...)
	got, err := releaseScript.Run(ctx, b.rdb, []string{b.keys.Usage(runID), b.keys.RunBudget(runID), b.keys.CallDone(runID, callID),
		b.keys.Lost(runID)}, args...).Int64()
	if err != nil {
		return false, fmt.Errorf("tally and release for run %s: %w", runID, err)
	}
	return got == 2, nil
}

// closeScript: KEYS usage (unused), budget hash, lease; ARGV max call ms, stale ms, mark.
// Returns 0 while calls are in flight, or tallied and not yet recorded on the run's row. The
// closed field holds the marks of every settlement that has closed the run, space-separated:
// one that closes a run already closed adds its mark rather than replacing the first's, which
// may still be committing. A close that finds its own mark there has run already (go-redis
// resends a script whose reply it lost) and returns 1 again: answered busy by what came after
// it (a lease written since), its settlement gave up and left the run closed, its mark
// unknown to anyone who could reopen it. A close whose mark has been reopened already (its
// o:<mark> field, reopenScript) arrived after its settlement gave up on it and reopened the run
// (a delayed packet): it closes nothing, and returns 0.
var closeScript = redis.NewScript(`
local staleArg, maxCallArg = 2, 1
local marks = redis.call('HGET', KEYS[2], 'closed')
if marks then
  for m in string.gmatch(marks, '%S+') do
    if m == ARGV[3] then return 1 end
  end
end
if redis.call('HEXISTS', KEYS[2], 'o:' .. ARGV[3]) == 1 then return 0 end
` + liveCallsLua + `
if inflight > 0 or recording > 0 or redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if marks then marks = marks .. ' ' .. ARGV[3] else marks = ARGV[3] end
redis.call('HSET', KEYS[2], 'closed', marks)
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1`)

// reopenScript: KEYS budget hash; ARGV mark, max call ms. Takes mark out of the closed marks;
// the run is open again only once no mark is left. It leaves o:<mark> = "<ms>" behind, for as
// long as a mark lives (max call; liveCallsLua drops it then), whether or not the close had
// landed: a close that reaches Redis after its settlement gave up on it and reopened (its
// request delayed on the network, not lost) finds it and closes nothing. Without it that close
// closed the run for max call, its calls refused as settled after a settle answered 503, with
// no one left to reopen it.
var reopenScript = redis.NewScript(`
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'o:' .. ARGV[1], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
local marks = redis.call('HGET', KEYS[1], 'closed')
if not marks then return 0 end
local rest = {}
for m in string.gmatch(marks, '%S+') do
  if m ~= ARGV[1] then rest[#rest + 1] = m end
end
if #rest == 0 then redis.call('HDEL', KEYS[1], 'closed') else redis.call('HSET', KEYS[1], 'closed', table.concat(rest, ' ')) end
return 0`)

// CloseRun marks the run as being settled, so that no call of it starts from now on and its
// tally is final. It fails with ErrRunBusy while calls of the run are in flight: settling
// then would leave their usage out of the charge. In flight means a reservation beaten
// within staleAfter, or a lease on the run: a process still serves one of its calls. The
// mark lasts maxCall: long enough for the settlement to commit, after which the run's hold
// refuses calls itself. The mark returned is for ReopenRun, should the settlement fail. It is
// returned with any error but ErrRunBusy too: a close whose reply was lost may have landed,
// and left so, the run's calls were refused as settled until the mark lapsed (maxCall) while
// nothing had settled it.
func (b *RunBudget) CloseRun(ctx context.Context, runID string) (string, error) {
	mark := token.New()
	ok, err := closeScript.Run(ctx, b.rdb, []string{b.keys.Usage(runID), b.keys.RunBudget(runID), b.keys.Lease(runID)},
		b.maxCall.Milliseconds(), b.staleAfter.Milliseconds(), mark).Int()
	if err != nil {
		return mark, fmt.Errorf("close run %s: %w", runID, err)
	}
	if ok == 0 {
		return "", ErrRunBusy
	}
	return mark, nil
}

// ReopenRun undoes CloseRun's mark after a settlement that did not commit, so that the run's
// calls are not refused as settled while it is not. Only its own mark: another settlement
// that has closed the run, before or since, keeps it closed, or a call could start between
// that settlement's tally read and its commit. Not for a settlement that may have committed
// after all (its reply lost): a call of the run admitted before the close would then reserve
// and run on a settled run, and never be charged.
func (b *RunBudget) ReopenRun(ctx context.Context, runID, mark string) error {
	if err := reopenScript.Run(ctx, b.rdb, []string{b.keys.RunBudget(runID)}, mark, b.maxCall.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("reopen run %s: %w", runID, err)
	}
	return nil
}

// rebuildScript: KEYS lost mark; ARGV wait ms, mark ttl ms. Marks the loss with the time when
// it is not marked yet; returns the ms still to wait from the mark, 0 once they have passed.
var rebuildScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = redis.call('GET', KEYS[1])
if not at then
  redis.call('SET', KEYS[1], now, 'PX', ARGV[2])
  return tonumber(ARGV[1])
end
return math.max(0, tonumber(at) + tonumber(ARGV[1]) - now)`)

// AwaitRebuild is for a run whose Redis record has lost calls (a restart without persistence):
// the reservations of its calls in flight were lost with it, and their leases are written
// again only at their process's next heartbeat, so CloseRun cannot see them yet. It fails with
// ErrRunBusy until staleAfter (the lease TTL, past any heartbeat interval) has passed since the
// loss was first noticed; the mark is lost, and the wait starts again, with a later restart.
func (b *RunBudget) AwaitRebuild(ctx context.Context, runID string) error {
	left, err := rebuildScript.Run(ctx, b.rdb, []string{b.keys.Lost(runID)}, b.staleAfter.Milliseconds(),
		b.tallyTTL.Milliseconds()).Int64()
	if err != nil {
		return fmt.Errorf("await rebuild of run %s: %w", runID, err)
	}
	if left > 0 {
		return ErrRunBusy
	}
	return nil
}

// Run beats this process's reservations every interval until ctx ends.
func (b *RunBudget) Run(ctx context.Context, interval time.Duration, log *zap.Logger) {
	if interval <= 0 || interval >= b.staleAfter {
		panic(fmt.Sprintf("runstate: run budget beat %v must be in (0, staleAfter %v)", interval, b.staleAfter))
	}
	heartbeat(ctx, interval, "run budget reservations", func(ctx context.Context) error {
		lost, err := b.Refresh(ctx)
		for _, rc := range lost {
			// Its beats missed staleAfter (a Redis outage, a stalled process) and another call
			// dropped it: the run's cap no longer counts this call. Its usage is still tallied.
			log.Warn("run budget reservation of a running call was dropped as stale", zap.String("run_id", rc.Run),
				zap.String("call_id", rc.Call))
		}
		return err
	}, log)
}

// touchScript: KEYS budget hash; ARGV call id, max call ms. Stamps the call's reservation with
// the time, if it is still there (a call released meanwhile stays released).
var touchScript = redis.NewScript(`
local field = 'c:' .. ARGV[1]
local v = redis.call('HGET', KEYS[1], field)
if not v then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], field, string.match(v, '^(%d+):') .. ':' .. now)
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1`)

// Refresh stamps every reservation this process holds, in pipelines of refreshBatch sent
// together (inBatches); a batch that fails does not keep the others from their beat. It returns the calls, still served
// here, whose reservation was gone: dropped as stale by another call of the run.
func (b *RunBudget) Refresh(ctx context.Context) ([]RunCallID, error) {
	b.mu.Lock()
	calls := make([]RunCallID, 0, len(b.calls))
	for rc := range b.calls {
		calls = append(calls, rc)
	}
	b.mu.Unlock()
	if len(calls) == 0 {
		return nil, nil
	}
	if err := touchScript.Load(ctx, b.rdb).Err(); err != nil {
		return nil, fmt.Errorf("refresh %d run reservations: %w", len(calls), err)
	}
	var goneMu sync.Mutex
	var gone []RunCallID
	err := inBatches(len(calls), func(start, end int) error {
		batch := calls[start:end]
		cmds, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, rc := range batch {
				touchScript.EvalSha(ctx, p, []string{b.keys.RunBudget(rc.Run)}, rc.Call, b.maxCall.Milliseconds())
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("refresh %d run reservations: %w", len(batch), err)
		}
		goneMu.Lock()
		defer goneMu.Unlock()
		for i, cmd := range cmds {
			if n, err := cmd.(*redis.Cmd).Int(); err == nil && n == 0 {
				gone = append(gone, batch[i])
			}
		}
		return nil
	})
	// A call released while its touch was on its way is gone too, and rightly. One still
	// served here is reported once; it is still beaten (a touch finds nothing and writes
	// nothing) until its call releases it.
	var lost []RunCallID
	b.mu.Lock()
	for _, rc := range gone {
		if reported, held := b.calls[rc]; held && !reported {
			b.calls[rc] = true
			lost = append(lost, rc)
		}
	}
	b.mu.Unlock()
	return lost, err
}

// Beaten is the number of reservations this process beats: one whose call ended without
// releasing it shows here (the proxy's tests look).
func (b *RunBudget) Beaten() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls)
}

// forget stops beating rc's reservation.
func (b *RunBudget) forget(rc RunCallID) {
	b.mu.Lock()
	delete(b.calls, rc)
	b.mu.Unlock()
}
