package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// IdempotencyKeyHeader makes a request safe to retry: every request of one user with one key
// is one logical request, run at most once at a time and, once answered, answered again from
// the stored response. ReplayedHeader marks such a stored answer.
const (
	IdempotencyKeyHeader = "Idempotency-Key"
	ReplayedHeader       = "Idempotent-Replayed"
	maxIdempotencyKeyLen = 255
)

// How an Idempotency-Key request is run (DESIGN §6).
//
// The run id is derived from (user, key, attempt): "r_" + hex(sha256(user \0 key [\0 n]))[:32],
// the same shape as a random run id so GET /v1/runs/{id} finds it. A second request while an
// attempt runs reaches Admit with the same run id, gets the existing hold back (no second
// hold: the primary key makes it impossible) and is answered 409 request_in_progress.
//
// The key's record in Redis, a hash under replay:{<attempt-0 run id>} living replay_ttl:
//
//	body     sha256 of the first request's route and body (requestHash): another under the key is 422
//	attempt  the attempt number now in use (absent: 0)
//	run      set once an attempt pinned the key: that attempt's run id; with it
//	status, ctype, hdrs, resp   what the caller was sent, byte for byte (a stream's events too)
//	large    "1": the response outgrew max_replay_len and was not kept; a replay is 409
//	superseded  "1": an attempt was stopped by a newer message of its session; a retry is 409
//	         (until an attempt run past it under dedup.fail_open pins the key: its answer is the key's)
//	fwd, fwd_until  an attempt paid under a pause is being forwarded (claimForward): its number,
//	         and until when (Redis clock, ms) the mark holds; a retry is 409 while it does
//
// An attempt pins the key when the caller was sent a 2xx answer (a complete one, or a stream
// that the upstream broke off after producing output). Any other end — refused after the hold,
// upstream error, or the client leaving (cancel) — leaves the key free: the attempt counter
// moves on and a retry runs as attempt n+1, a new run id, since attempt n's hold is settled
// and settled holds are final. A cancelled attempt is charged what it used and its retry is
// charged again: the provider did that work twice, and a truncated answer is not worth
// replaying.
//
// An answer that pins is recorded before its last bytes are sent (pinBeforeAnswer), so that a
// caller holding a whole answer always finds it pinned, even if the process dies the next
// moment; every record is written before the attempt's settlement, so a request that finds the
// attempt's hold settled (Admit: ErrRunSettled) finds the record final too. If that write
// failed (Redis down at that moment), or Redis lost the record whole, a retry goes by the
// attempt's row (attemptPinned): one that pinned is refused 409 idempotent_response_lost — the
// promise is one charge per key; the 409 names the run, which GET /v1/runs/{id} shows.
type idemCall struct {
	key      string
	userID   uint64
	bodyHash string
	attempt  int
	record   string // the Redis key of the record
	// body is the request's, until its admission: a record stored by a gateway from before the
	// route was hashed with the body holds the body's hash alone (sameRequest).
	body []byte
	// lease counts the request's memory (bodyMemory): a replay adds the stored answer it sends.
	lease *bodyLease
	// recordHash is the hash the key's record, as last read, names this request's body by:
	// bodyHash, or an older gateway's hash of the body alone (sameRequest); "" when the record
	// held none or was not read (dedup.fail_open). The attempt's writes keep it, or set bodyHash.
	recordHash string
}

// writtenHash is the body hash an attempt's record writes name its request by (idemWriteScript).
func (ic *idemCall) writtenHash() string {
	if ic.recordHash != "" {
		return ic.recordHash
	}
	return ic.bodyHash
}

// sameRequest reports whether a record's stored hash is this request's: its route and body, or,
// in a record an older gateway stored during a rolling upgrade, its body alone (a retry that
// reached the newer gateway was otherwise 422 for the record's replay_ttl, and a client that then
// retried under a new key paid twice). Computed only when the first comparison fails.
func (ic *idemCall) sameRequest(stored string) bool {
	if stored == ic.bodyHash {
		return true
	}
	if ic.body == nil {
		return false
	}
	sum := sha256.Sum256(ic.body)
	return stored == hex.EncodeToString(sum[:])
}

// errOvertaken answers the caller of an attempt whose hold another process charged while its
// own process was stopped before the forward, and whose key a retry moved on meanwhile to
// attempt runID (paidUnderAPause): not forwarded, nothing charged. Its retry is runID's answer
// (replayed, or 409 while runID runs), or runs the key's next attempt if runID failed. The
// code is request_in_progress's, which SDKs retry.
func errOvertaken(runID string) *apiError {
	return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "request_in_progress", RunID: runID,
		RetryAfter: time.Second,
		Message: "While this request's gateway was stopped, a retry with this Idempotency-Key took the key over (run " + runID +
			"); this request was not run, and is not charged. Retry to get the key's answer."}
}

func errRequestInProgress(runID string) *apiError {
	return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "request_in_progress", RunID: runID,
		RetryAfter: time.Second,
		Message:    "A request with this Idempotency-Key is still running (run " + runID + "). Retry to get its answer."}
}

var errKeyReused = &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused",
	Message: "This Idempotency-Key was used with a different request body or on another route. Use a new key for a new request."}

func errReplayTooLarge(runID string, limit int64) *apiError {
	return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotent_response_too_large", RunID: runID,
		Message: fmt.Sprintf("The request with this Idempotency-Key already ran (run %s), but its answer was larger than %d bytes and was not kept for replay.", runID, limit)}
}

func errReplayOverShare(runID string, limit int64) *apiError {
	return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotent_response_too_large", RunID: runID,
		Message: fmt.Sprintf("The request with this Idempotency-Key already ran (run %s), but its answer was not kept for replay: the answers kept for this caller already held %d bytes.", runID, limit)}
}

func errReplayLost(runID string) *apiError {
	return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotent_response_lost", RunID: runID,
		Message: "The request with this Idempotency-Key already ran (run " + runID + "), but its stored answer was lost; it is not run again."}
}

// errAttemptUnrecorded answers a retry whose attempt is taken as pinned for its charge alone
// (attemptPinned): charged by the reconciler, its key's record gone, nothing on its row says it
// answered. It may have (Redis lost the record of its answer), or not: its process was killed,
// or is only stopped, between its admission and the record's first write. Not run again, as
// errReplayLost; but worded so, "already ran ... its stored answer was lost", it told the
// caller of an attempt still to be forwarded that it had run, and that its answer was gone for
// good, when a resumed process then answered it and pinned the key.
func errAttemptUnrecorded(runID string) *apiError {
	return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotent_response_lost", RunID: runID,
		Message: "The request with this Idempotency-Key was admitted (run " + runID + ") and charged, but the key's record is gone " +
			"(its gateway stopped before writing it, or Redis lost it); it is not run again. A gateway that was only paused " +
			"answers the first request once resumed, and a retry then gets that answer."}
}

// validIdempotencyKey: 1-255 printable ASCII characters.
func validIdempotencyKey(k string) bool {
	if len(k) == 0 || len(k) > maxIdempotencyKeyLen {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// idempotentRunID is the run id of one attempt of an idempotent request.
func idempotentRunID(userID uint64, key string, attempt int) string {
	s := strconv.FormatUint(userID, 10) + "\x00" + key
	if attempt > 0 {
		s += "\x00" + strconv.Itoa(attempt)
	}
	h := sha256.Sum256([]byte(s))
	return "r_" + hex.EncodeToString(h[:16])
}

type idemRecord struct {
	bodyHash string
	attempt  int
	run      string
	large    bool
	// overShare: the answer was not kept because its caller's kept answers were at
	// dedup.max_replay_bytes_per_caller (large is set too, which older gateways read).
	overShare bool
	// superseded: an attempt was stopped by a newer message of its session. Its retries are
	// answered 409 superseded, not run: run again, the old message would replace the newer.
	superseded bool
}

func (s *Server) readIdem(ctx context.Context, ic *idemCall) (idemRecord, error) {
	s.beforeStep(ctx, stepIdemRecord)
	ctx, cancel := redisStep(ctx)
	defer cancel()
	v, err := s.dedupRDB.HMGet(ctx, ic.record, "body", "attempt", "run", "large", "superseded", "large_why").Result()
	if err != nil {
		return idemRecord{}, fmt.Errorf("read idempotency record: %w", err)
	}
	str := func(i int) string { s, _ := v[i].(string); return s }
	rec := idemRecord{bodyHash: str(0), run: str(2), large: str(3) == "1", superseded: str(4) == "1", overShare: str(5) == "share"}
	rec.attempt, _ = strconv.Atoi(str(1)) // only this gateway writes it (advanceScript): digits
	return rec, nil
}

// advanceScript moves the attempt counter past attempt ARGV[1], never backwards, and then
// (only then) keeps the record for replay_ttl (ARGV[2] ms) from now. A record another attempt
// pinned, or whose counter is already past ARGV[1], is left as it is: a late attempt's end
// (its hold settled under it, and the key retried) set a pinned answer's expiry again, and it
// was replayed for replay_ttl from that end, not from the answer.
//
// Nor is one that an attempt paid under a pause has marked as being forwarded (claimForward),
// while the mark holds, unless ARGV[3] is "1" and the mark is attempt ARGV[1]'s: the attempt's
// own end moves past it and drops its mark; no other end does. Returns 2 when so refused: the
// caller, a retry that found the attempt's hold settled, answers 409 request_in_progress. The
// check and the move are one script, as the mark's write is: of a retry's move and the
// attempt's mark, whichever comes first stops the other.
//
// Another attempt's mark cannot hold under a counter at or below the ending attempt while the
// record is whole and read (the counter passed the marked attempt only once its mark had
// gone), but can once Redis lost the record and the marked attempt's mark wrote it anew, counter and
// all gone: the end of another stopped attempt of the key, resumed after that mark, took the
// key for its own, dropped the mark, and the retry moved past the forwarded attempt and ran
// the key beside it, charged twice (TestIdemEarlierAttemptsEndKeepsALaterAttemptsMark).
var advanceScript = redis.NewScript(`
local a = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0')
if redis.call('HEXISTS', KEYS[1], 'run') == 1 or a > tonumber(ARGV[1]) then return 0 end
local f = redis.call('HGET', KEYS[1], 'fwd')
if f and (ARGV[3] ~= '1' or tonumber(f) ~= tonumber(ARGV[1])) then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if tonumber(redis.call('HGET', KEYS[1], 'fwd_until') or '0') > now then return 2 end
end
redis.call('HDEL', KEYS[1], 'fwd', 'fwd_until')
redis.call('HSET', KEYS[1], 'attempt', tonumber(ARGV[1]) + 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)

// errAttemptForwarded: a retry's move past a settled attempt was refused, the attempt being
// forwarded by its resumed process (claimForward); or an attempt's own move, another attempt
// being so forwarded.
var errAttemptForwarded = errors.New("an attempt of the key is being forwarded by its resumed process")

// advanceIdem moves ic's key past attempt (advanceScript); own says the attempt itself has
// ended, else a retry found it settled. It fails with errAttemptForwarded while an attempt of
// the key is being forwarded under its mark: attempt itself (a retry's move), or, for own,
// another one.
func (s *Server) advanceIdem(ctx context.Context, ic *idemCall, attempt int, own bool) error {
	ctx, cancel := redisStep(ctx)
	defer cancel()
	n, err := advanceScript.Run(ctx, s.dedupRDB, []string{ic.record}, attempt, s.cfg.Dedup.ReplayTTL.Milliseconds(), own).Int()
	if err != nil {
		return fmt.Errorf("advance idempotency attempt: %w", err)
	}
	if n == 2 {
		return fmt.Errorf("advance idempotency attempt %d: %w", attempt, errAttemptForwarded)
	}
	return nil
}

// claimForwardScript marks the key's record, unless the key has moved on, as being run by
// attempt ARGV[2] (run id ARGV[1]) for ARGV[5] ms from now by the Redis clock (fwd,
// fwd_until): a retry's move past the attempt (advanceScript) is refused while the mark holds.
// It returns the run id that pinned the key, the attempt number the counter has moved to, or
// that of another attempt whose mark holds, when the key is no longer the attempt's; else ""
// (marked). Another's mark that holds stops it, as the counter would had Redis not lost it:
// with the record lost and written anew by that attempt's mark, an attempt of the key
// stopped beside it and resumed after it marked the key over it and was forwarded too, two
// upstream calls and two charges for one key
// (TestIdemEarlierAttemptResumedUnderALaterAttemptsMarkIsNotForwarded). An earlier attempt's
// mark under a later attempt that resumes is left only to a race (laterAttempt, read before
// the mark, found no row of the next attempt, whose retry passed the attempt just before).
//
// The body is set if missing, and the record kept for replay_ttl (ARGV[4] ms), as
// idemWriteScript does, or for the mark's time if that is longer: the mark lives in the
// record, and a record that expired under it (a replay_ttl shorter than maxCall) left a retry
// no record, the attempt (admitted longer than replay_ttl ago) taken for one that had not
// pinned, and the key run again beside it.
var claimForwardScript = redis.NewScript(`
local run = redis.call('HGET', KEYS[1], 'run')
if run and run ~= ARGV[1] then return run end
local a = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0')
if a > tonumber(ARGV[2]) then return a end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HGET', KEYS[1], 'fwd')
if f and tonumber(f) ~= tonumber(ARGV[2]) and tonumber(redis.call('HGET', KEYS[1], 'fwd_until') or '0') > now then return tonumber(f) end
redis.call('HSETNX', KEYS[1], 'body', ARGV[3])
redis.call('HSET', KEYS[1], 'fwd', ARGV[2], 'fwd_until', string.format('%d', now + tonumber(ARGV[5])))
redis.call('PEXPIRE', KEYS[1], math.max(tonumber(ARGV[4]), tonumber(ARGV[5])))
return ''`)

// claimForward is the last check of an attempt whose hold another process charged while its
// own process was stopped before the forward (paidUnderAPause), and its mark on the key: it
// returns the run id of the later attempt a retry has run meanwhile (the retry found c's hold
// settled, could not tell a stopped process from a killed one, and moved the key past c:
// passSettled), or of another attempt forwarded under its mark (Redis lost the counter), or
// "" once the key's record says c is being forwarded. Forwarded after a retry
// moved on, c ran the key a second time, charged what it used beside the later attempt's
// charge, its answer stored nowhere (errIdemMovedOn). Forwarded unmarked, a retry arriving
// while it ran did the same: it found c settled, moved past it and ran the next attempt.
//
// The mark holds for the longest a call lives (maxCall), and c's own end drops it (finishIdem):
// a process killed mid-forward keeps the key's retries at 409 request_in_progress that long at
// most. An error says the record could not be written (Redis out of reach): the mark may or
// may not have landed.
func (s *Server) claimForward(ctx context.Context, c *call) (string, error) {
	ctx, cancel := redisStep(ctx)
	defer cancel()
	ic := c.idem
	v, err := claimForwardScript.Run(ctx, s.dedupRDB, []string{ic.record}, c.runID, ic.attempt, ic.bodyHash,
		s.cfg.Dedup.ReplayTTL.Milliseconds(), s.maxCall().Milliseconds()).Result()
	if err != nil {
		return "", fmt.Errorf("mark the idempotency record of an attempt paid under a pause: %w", err)
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case int64:
		return idempotentRunID(ic.userID, ic.key, int(v)), nil
	}
	return "", nil
}

// laterAttempt returns the run id of c's key's next attempt when its row exists, else "": a
// retry admits attempt n+1 only once it has passed attempt n, so the row says, as the key's
// record's counter does, that the key has moved on past c (paidUnderAPause). The counter alone
// said it until Redis lost the record (a restart without persistence, an eviction, a
// failover): c, stopped before its forward and resumed after the loss, found the key its own,
// marked it (claimForward) and was forwarded beside the later attempt's answer, or its call
// still running unmarked, two upstream calls and two charges for one key
// (TestIdemAttemptPausedWhileARetryRanTheKeyIsNotForwardedOnceRedisLostTheRecord).
func (s *Server) laterAttempt(ctx context.Context, c *call) (string, error) {
	next := idempotentRunID(c.idem.userID, c.idem.key, c.idem.attempt+1)
	_, err := s.store.Run(ctx, c.user.ID, next)
	if errors.Is(err, holds.ErrRunNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the idempotent attempt after %s: %w", c.runID, err)
	}
	return next, nil
}

// maxIdemRounds bounds admitIdempotent's reads of a key's record when each finds its attempt
// just settled and moves past it: a key retried that fast is answered 409
// request_in_progress (retry) rather than spun on.
const maxIdemRounds = 4

// admitIdempotent admits the current attempt of an idempotent request, or answers the request
// itself: a replay, 409 request_in_progress, 422 for a reused key. answered is the status sent,
// 0 when the caller goes on with the returned hold (ar.RunID is then the attempt's run id).
// callLog is the request's logger without a run id: a line names the run ar.RunID names at
// the time, the attempt's once it is known (a lost admission's release is of that run).
func (s *Server) admitIdempotent(w http.ResponseWriter, r *http.Request, actx context.Context, ic *idemCall, ar *holds.AdmitRequest,
	callLog *zap.Logger) (holds.Hold, int) {
	a := &idemAdmission{s: s, w: w, r: r, ctx: actx, ic: ic, ar: ar, callLog: callLog,
		log: callLog.WithLazy(zap.String("run_id", ar.RunID))}
	for range maxIdemRounds {
		rec, status := a.readRecord()
		if status != 0 {
			return holds.Hold{}, status
		}
		if e := a.refusalOf(rec); e != nil {
			return holds.Hold{}, a.answer(e, false)
		}
		if rec.run != "" {
			status, again := a.replayPinned(rec)
			if again {
				continue
			}
			return holds.Hold{}, status
		}
		hold, status, again := a.admitAttempt(rec.attempt)
		if !again {
			return hold, status
		}
	}
	return holds.Hold{}, a.answer(errRequestInProgress(ar.RunID), true)
}

// idemAdmission is one admitIdempotent: its request, and the logger of the run ar.RunID names
// at the time (log), which moves to the attempt's run once its number is read.
type idemAdmission struct {
	s       *Server
	w       http.ResponseWriter
	r       *http.Request
	ic      *idemCall
	ar      *holds.AdmitRequest
	callLog *zap.Logger
	log     *zap.Logger
	// unread: the key's record could not be read and dedup.fail_open goes on without it from
	// attempt floor, the first attempt not known, by its settled row, to have ended unpinned.
	unread bool
	floor  int
	// ctx is the call's admission budget (admissionContext): every read, write and admission
	// of admitIdempotent's rounds runs under it, so all of them together take at most admit_timeout.
	// r's own context tells a caller that left.
	ctx context.Context
}

// answer answers the request without running it (a replay's refusal, a reused key, a running
// attempt), and returns the status sent.
func (a *idemAdmission) answer(e *apiError, retry bool) int {
	logRefusal(a.log, e, "idempotent request answered without running", nil, zap.String("of_run", e.RunID))
	a.s.writeDuplicate(a.w, e, retry)
	return e.Status
}

// fail answers a failure of Redis or the database, unless the caller has left: then the
// failure is its cancelled context, there is no one to answer, and nothing is held.
func (a *idemAdmission) fail(e *apiError, msg string, err error) int {
	if a.r.Context().Err() != nil {
		e, why := ended(a.r.Context(), "during the idempotency check; nothing held")
		logRefusal(a.log, e, why, err, zap.String("step", msg))
		return answerClientClosed(a.w, a.r)
	}
	logRefusal(a.log, e, msg, err)
	writeError(a.w, e)
	return e.Status
}

// readRecord reads the key's record, or answers the request (status) when it cannot be read
// and the gateway does not fail open.
func (a *idemAdmission) readRecord() (idemRecord, int) {
	if a.unread {
		return idemRecord{attempt: a.floor}, 0
	}
	rec, err := a.s.readIdem(a.ctx, a.ic)
	if err == nil {
		return rec, 0
	}
	if !a.s.cfg.Dedup.FailOpen || a.r.Context().Err() != nil {
		return idemRecord{}, a.fail(errDedupDown, "idempotency record unreadable", err)
	}
	// fail_open: attempt 0, and the next one past each that its row shows ended unpinned
	// (passSettled). The hold's primary key still keeps two attempts from running at once; only
	// a replay is impossible.
	a.log.Warn("idempotency record unreadable; going on (fail_open)", zap.Error(err))
	a.unread = true
	return idemRecord{attempt: a.floor}, 0
}

// refusalOf is the answer a record gives every request under its key without a look at its
// answer: a reused key's, or a superseded attempt's; nil when it gives none.
func (a *idemAdmission) refusalOf(rec idemRecord) *apiError {
	if rec.bodyHash != "" && !a.ic.sameRequest(rec.bodyHash) {
		return errKeyReused
	}
	a.ic.recordHash = rec.bodyHash
	if rec.superseded {
		return errSupersededAnswer
	}
	return nil
}

// replayPinned answers the request from the answer of the attempt that pinned the key (rec.run),
// and returns the status sent; again when that answer expired since rec was read.
func (a *idemAdmission) replayPinned(rec idemRecord) (status int, again bool) {
	if rec.overShare {
		return a.answer(errReplayOverShare(rec.run, a.s.cfg.Dedup.ReplayBytesPerCaller()), false), false
	}
	if rec.large {
		return a.answer(errReplayTooLarge(rec.run, a.s.cfg.Dedup.MaxReplayLen), false), false
	}
	status, err := a.s.replay(a.ctx, a.w, a.ic, a.log)
	if errors.Is(err, errStoredAnswerGone) {
		return 0, true // expired since it was read: the key is free, or Redis lost it (read again)
	}
	if errors.Is(err, errStoredAnswerOtherBody) {
		return a.answer(errKeyReused, false), false
	}
	if e := bodyMemoryError(err); e != nil {
		logRefusal(a.log, e, "stored answer not replayed: no room in memory", err, zap.String("of_run", rec.run))
		writeError(a.w, e)
		return e.Status, false
	}
	if errors.Is(err, errStoredAnswerCorrupt) {
		a.log.Error("idempotent request's stored answer is corrupt; not run again", zap.Error(err))
		return a.answer(errReplayLost(rec.run), false), false
	}
	if err != nil {
		return a.fail(errDedupDown, "stored answer unreadable", err), false
	}
	a.log.Info("idempotent request replayed", zap.String("of_run", rec.run))
	return status, false
}

// admitAttempt holds credits for the key's attempt under its run id, which ar.RunID then names.
// It returns the hold (status 0), or the status of the answer written instead; again when the
// attempt was found settled and the record is to be read again.
func (a *idemAdmission) admitAttempt(attempt int) (_ holds.Hold, status int, again bool) {
	a.ic.attempt = attempt
	a.ar.RunID = idempotentRunID(a.ic.userID, a.ic.key, attempt)
	a.log = a.callLog.WithLazy(zap.String("run_id", a.ar.RunID))
	hold, err := a.s.admit(a.ctx, *a.ar, a.log, nil)
	switch {
	case err == nil && hold.Existing:
		return holds.Hold{}, a.answer(errRequestInProgress(a.ar.RunID), true), false
	case err == nil && budgetSpent(a.ctx):
		// Granted past the admission budget: runCall refuses it and releases the hold at 0
		// (refuseLate), so there is nothing to record, and the record's write, under a
		// spent context, would only log a failure beside the refusal.
		return hold, 0, false
	case err == nil:
		a.s.beforeStep(a.ctx, stepAttemptAdmitted)
		if err := a.s.startIdem(a.ctx, a.ic); err != nil {
			// The in-flight guard is the hold; the stored body hash only refines a
			// reused key's answer from 409 to 422. Going on is safe.
			a.log.Warn("idempotency record not started", zap.Error(err))
		}
		return hold, 0, false
	case errors.Is(err, holds.ErrRunSettled):
		status := a.passSettled(attempt)
		return holds.Hold{}, status, status == 0
	default:
		return holds.Hold{}, a.refuseAdmission(err), false
	}
}

// passSettled moves the key past its settled attempt when that attempt did not pin it, and
// returns 0 to read the record again, or the status of the answer written instead.
//
// The attempt ended between the read and the admission, or its end did not reach the
// record. Its record is final now (it is written before settlement): read again, and
// if the attempt did not pin the key, move past it. Whether it pinned is its run's
// row's to say, not the record's: a record without an answer is one whose answer was
// never stored (Redis failed that write), or that Redis lost whole (a restart, a
// failover) — either way an attempt that ended complete must not run again.
//
// Without the record (Redis out of reach), the row alone decides, and no answer is made up
// from the record's absence: read again, an unreadable record under dedup.fail_open named
// attempt 0 each time, and every retry of a key used before was answered 409
// request_in_progress ("still running", to be retried) for as long as Redis was out. An
// attempt that pinned the key cannot be replayed now, and is not run again: 503
// dedup_unavailable, to be retried once Redis is back. One that did not pin is passed over
// here alone under fail_open, which lets the next attempt run; else the same 503.
func (a *idemAdmission) passSettled(attempt int) int {
	rec, readErr := idemRecord{}, errRecordUnread
	if !a.unread {
		rec, readErr = a.s.readIdem(a.ctx, a.ic)
	}
	if readErr == nil && (rec.run != "" || rec.superseded || rec.attempt != attempt) {
		return 0
	}
	if readErr != nil && (!a.s.cfg.Dedup.FailOpen || a.r.Context().Err() != nil) {
		return a.fail(errDedupDown, "idempotency record unreadable", readErr)
	}
	// A record without the body hash every attempt's admission writes is one Redis lost whole
	// (or never had): what it said of the attempt is gone.
	pinned, answered, err := a.s.attemptPinned(a.ctx, a.ic.userID, a.ar.RunID, readErr != nil || rec.bodyHash == "")
	if err != nil {
		return a.fail(errBillingDown, "idempotent attempt unreadable", err)
	}
	switch {
	case readErr != nil && pinned:
		return a.fail(errDedupDown, "idempotency record unreadable; its pinned attempt is not run again", readErr)
	case readErr != nil:
		a.unread, a.floor = true, attempt+1
		return 0
	case pinned && !answered:
		return a.answer(errAttemptUnrecorded(a.ar.RunID), false)
	case pinned:
		return a.answer(errReplayLost(a.ar.RunID), false)
	}
	if err := a.s.advanceIdem(a.ctx, a.ic, attempt, false); errors.Is(err, errAttemptForwarded) {
		// Its hold settled under a pause, its process resumed and is forwarding it (claimForward).
		return a.answer(errRequestInProgress(a.ar.RunID), true)
	} else if err != nil {
		return a.fail(errDedupDown, "idempotency attempt not advanced", err)
	}
	return 0
}

// errRecordUnread stands for the failure that left an admission without its key's record
// (idemAdmission.unread), which is not read again within the admission.
var errRecordUnread = errors.New("idempotency record unreadable earlier in this admission")

// refuseAdmission answers an attempt's failed admission, whose hold, if the failure hid one
// that landed, is released.
func (a *idemAdmission) refuseAdmission(err error) int {
	a.s.releaseLostAdmission(a.r.Context(), *a.ar, err, a.log)
	e := a.s.admitError(err)
	if e.Status >= 500 {
		return a.fail(e, "admission failed", err)
	}
	// The caller's refusal (402, 429, ...) writes its line, as a plain call's does.
	logRefusal(a.log, e, "admission", err)
	writeError(a.w, e)
	return e.Status
}

// attemptPinned reports whether the settled attempt runID of a key whose record holds no
// answer had pinned the key, by its run's row: an attempt that ended complete must not run, nor be
// charged, again. Pinned as finishIdem pins: complete, or a stream that broke after output —
// output as the row counts it, its tokens, where finishIdem counts what was sent: a stream that
// reported output tokens and broke before sending any text, and whose move to the next attempt
// Redis failed to record too, is taken as pinned (409, not run again). A
// record gone because replay_ttl passed since its last write expired; the key is then free,
// as it was before (README: replayed for replay_ttl).
//
// The window is measured from the attempt's admission (created_at), which comes before every
// write of its record, so it never outlasts the record: measured from settled_at, a settlement
// that lagged the answer (it failed and the reconciler charged the hold at its expiry, or the
// process was killed after the answer) kept the key refused 409 idempotent_response_lost — "not
// run again" — for as long as the lag after its record had expired, then ran it.
//
// recordGone says the record is unread or lost whole, not merely without an answer. The
// reconciler settles a killed process's attempt by its tally (reconcile) or its hold
// (reconcile_hold), whether or not it had pinned the key: with the record there and no answer
// in it, it had not, and the key runs again — unless its row records its call, which an attempt
// whose answer Redis refused to store writes before that answer's end (recordAnsweredAttempt);
// with the record gone, the row cannot tell, and an
// attempt that cost something is taken as pinned (409, not run again). Taken as unpinned, an
// answer pinned and then settled by the reconciler ran, and was charged, a second time once
// Redis lost its record (a restart without persistence). answered says the row shows the
// answer that pinned the key; an attempt taken as pinned for its cost alone may have answered
// nothing yet (errAttemptUnrecorded).
func (s *Server) attemptPinned(ctx context.Context, userID uint64, runID string, recordGone bool) (pinned, answered bool, err error) {
	sctx, cancel := s.storeContext(ctx)
	defer cancel()
	s.beforeStep(sctx, stepAttemptPinned)
	run, err := s.store.Run(sctx, userID, runID)
	if err != nil {
		return false, false, err // names the run already
	}
	src := run.SettleSource.String
	// An attempt's row records a call (ended_calls) only when it pinned the key and Redis
	// refused its answer (recordAnsweredAttempt): pinned, however it was settled.
	answered = src == holds.SourceComplete || (src == holds.SourceStreamError && run.OutTok > 0) || run.EndedCalls > 0
	pinned = answered || (recordGone && (src == holds.SourceReconcileHold || (src == holds.SourceReconcile && run.CostMicro > 0)))
	if pinned && !answered && src == holds.SourceReconcileHold {
		// Its charge given back whole (refundPausedHold) for a call that answered nothing, the
		// attempt used nothing: resumed after a pause, it was not forwarded (overtaken, its
		// caller gone), or its upstream refused it (its caller was answered that error). Taken as
		// pinned, its retry was told 409 idempotent_response_lost, "admitted and charged", of
		// an attempt that cost nothing, and the key, which no attempt may have answered, was
		// refused for replay_ttl (TestIdemOvertakenAttemptRefundedWholeIsPassedOnceRedisLostTheRecord,
		// TestIdemResumedAttemptRefusedByItsUpstreamIsPassedOnceRedisLostTheRecord). A whole
		// refund of a call that answered is no such sign: one answered at no cost (a discount of
		// 10 000 bp) is given back whole too, and passed, its key ran again
		// (TestIdemResumedAttemptThatAnsweredFreeIsNotRunAgainOnceRedisLostTheRecord).
		refunded, answeredNothing, err := s.store.PauseRefunded(sctx, userID, runID)
		if err != nil {
			return false, false, err // names the run already
		}
		pinned = !answeredNothing || refunded < run.ChargedMicro
	}
	// Measured by the database clock, which created_at is on, not the gateway's.
	return pinned && run.Age() < s.cfg.Dedup.ReplayTTL, answered, nil
}

// startIdem records the body the key was first used with, once the attempt is admitted.
//
// Not before the admission, though a process killed between the two leaves a hold, charged by
// the reconciler, and no record: its retry then finds the record gone and is refused 409
// idempotent_response_lost, though nothing was forwarded (README Known limits; charged once).
// Written before, a record would be written by every request under a key, a retry's too, and
// a record Redis lost could no longer be told from one a retry had just written: after a loss,
// a second retry (or one beside the first) found a record without an answer, took the
// reconciled attempt for unpinned and ran it again, charged twice.
func (s *Server) startIdem(ctx context.Context, ic *idemCall) error {
	ctx, cancel := redisStep(ctx)
	defer cancel()
	_, err := s.dedupRDB.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSetNX(ctx, ic.record, "body", ic.bodyHash)
		p.PExpire(ctx, ic.record, s.cfg.Dedup.ReplayTTL)
		return nil
	})
	if err != nil {
		return fmt.Errorf("start idempotency record: %w", err)
	}
	return nil
}

// A stored answer read apart from the record that named it: gone means the record expired
// in between (its replay_ttl passed); other body, that it expired and a request with another
// body under the key ran and pinned it in between (a reused key, as had it come after);
// corrupt means a record names a run but holds no answer a caller could have been sent
// (edited by hand, a partial write): the attempt ran, so it is not run again, and writing its
// status would panic net/http on a 0.
var (
	errStoredAnswerGone      = errors.New("stored answer expired since its record was read")
	errStoredAnswerOtherBody = errors.New("stored answer is of another body")
	errStoredAnswerCorrupt   = errors.New("stored answer corrupt")
)

// replay answers from the stored response. Nothing is written to w unless it returns nil.
func (s *Server) replay(ctx context.Context, w http.ResponseWriter, ic *idemCall, log *zap.Logger) (int, error) {
	rctx, cancel := redisStep(ctx)
	defer cancel()
	v, err := s.dedupRDB.HMGet(rctx, ic.record, "ctype", "resp", "hdrs", "run", "status", "body").Result()
	if err != nil {
		return 0, fmt.Errorf("read stored answer: %w", err)
	}
	ctype, _ := v[0].(string)
	resp, hasResp := v[1].(string)
	run, _ := v[3].(string)
	status, _ := v[4].(string)
	if run == "" {
		return 0, errStoredAnswerGone
	}
	if body, _ := v[5].(string); body != "" && !ic.sameRequest(body) {
		return 0, errStoredAnswerOtherBody
	}
	code, err := strconv.Atoi(status)
	if !hasResp || err != nil || code < 200 || code > 299 {
		return 0, fmt.Errorf("%w: run %s, status %q, answer stored %t", errStoredAnswerCorrupt, run, status, hasResp)
	}
	hdrs, _ := v[2].(string)
	// Replays are answered before admission, so max_in_flight does not bound them, and each
	// holds the stored answer (up to max_replay_len) until a caller that may not read has it:
	// uncounted, one caller sending its key again on many connections held as many copies.
	// Counted as the request's memory, bounded per caller and per process as bodies are; at
	// most what the caller's share leaves beside the request's own body, so that an answer
	// larger than the share can still be replayed.
	if ic.lease != nil {
		_, perCaller := s.cfg.Limits.BodyMemoryBounds()
		if err := ic.lease.reserve(min(int64(len(resp)+len(hdrs)), perCaller-ic.lease.n)); err != nil {
			return 0, fmt.Errorf("replay run %s: %w", run, err)
		}
	}
	h := w.Header()
	if hdrs != "" {
		var stored http.Header
		if err := json.Unmarshal([]byte(hdrs), &stored); err != nil {
			// The answer itself is whole: the caller gets it, without the provider's headers.
			log.Warn("stored answer's headers unreadable; replayed without them", zap.String("of_run", run), zap.Error(err))
		}
		for k, vv := range stored {
			if _, skip := unreplayedHeaders[http.CanonicalHeaderKey(k)]; !skip {
				h[http.CanonicalHeaderKey(k)] = vv
			}
		}
	}
	if ctype != "" {
		h.Set("Content-Type", ctype)
	}
	s.metrics.Duplicates.WithLabelValues("replayed").Inc()
	h.Set(ReplayedHeader, "true")
	h.Set(RunIDHeader, run)
	h.Set("Content-Length", strconv.Itoa(len(resp)))
	bound := s.boundWrites(http.NewResponseController(w))
	bound.next()
	w.WriteHeader(code)
	_, _ = bound.write(w, []byte(resp))
	return code, nil
}

// unreplayedHeaders are not restored on a replay: they belong to the first answer's
// connection, or the replay sets them itself.
var unreplayedHeaders = setOf("Content-Length", "Content-Type", "Date", "Connection", "Keep-Alive", "Transfer-Encoding",
	"Trailer", "Te", "Upgrade", "Set-Cookie", RunIDHeader, RequestIDHeader, ReplayedHeader, shouldRetryHeader)

// replayableHeaders are the headers of an answer kept with it for replays (DESIGN §6: status,
// headers, body).
func replayableHeaders(h http.Header) http.Header {
	out := http.Header{}
	for k, vv := range h {
		if _, skip := unreplayedHeaders[http.CanonicalHeaderKey(k)]; !skip {
			out[k] = vv
		}
	}
	return out
}

// pinBeforeAnswer pins an idempotent attempt whose answer is whole on the answer, before its
// last bytes (tail, still to be sent) go out. Pinned only once the caller has everything, a
// process killed in between leaves a caller with a complete answer (that the reconciler
// charges) and a key that is not pinned: the retry would run, and be charged, again. Pinned
// first, a kill before the end is sent gives the retry the answer the attempt paid for.
//
// The record keeps the answer up to tail; what a stream's upstream sends after its final event
// (not part of the answer) reaches the caller but not the record. An attempt that does not pin
// (not 2xx, no output) is left to finishIdem, as is one whose record write failed: it tries
// again when the call ends.
func (s *Server) pinBeforeAnswer(ctx context.Context, c *call, o outcome, status int, tail []byte) {
	if c.idem == nil || !c.pinsIdem(status, o) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), idemWriteTimeout)
	defer cancel()
	c.rw.keep(tail)
	c.rw.capture = false
	if err := s.storeIdemAnswer(ctx, c, status); errors.Is(err, errIdemMovedOn) {
		c.log.Info("idempotent answer not stored: the key moved on to a later attempt while this one ran", zap.Error(err))
	} else if err != nil {
		c.log.Warn("idempotent answer not stored before its end; tried again when the call ends", zap.Error(err))
		s.recordAnsweredAttempt(ctx, c, o)
		return
	}
	c.idemPinned = true // or never to be: finishIdem has nothing left to write
}

// recordAnsweredAttempt records the call of an attempt that pins its key, whose answer Redis
// refused to store, on the attempt's row (holds.Store.RecordRunCall, under the run's own id:
// counted once however often it is sent), before the answer's end goes out: the database is
// then the record of last resort that the attempt pinned (attemptPinned reads its ended_calls),
// and the reconciler settles it from the call's figures rather than its hold. Without it, a
// process killed between the answer and its settlement left a row the reconciler settled
// (reconcile, reconcile_hold) as it settles an attempt cut mid-call, and a record holding no
// answer: the retry took the attempt for one that had not pinned, ran it again and charged the
// key twice. Only when Redis failed: a store that fails too leaves the key as before.
func (s *Server) recordAnsweredAttempt(ctx context.Context, c *call, o outcome) {
	if c.idemOnRow {
		return
	}
	st := s.settlementAs(c, o)
	sctx, cancel := s.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	// ttl 0: the record leaves the hold's expiry as it is.
	if _, err := s.store.RecordRunCall(sctx, c.runID, c.runID, 0, st.Usage, st.CostMicro, st.Calls, st.Estimated); err != nil {
		c.log.Error("idempotent answer recorded neither in Redis nor on its row; killed before its settlement, its retry runs and is charged again",
			zap.Error(err))
		return
	}
	c.idemOnRow = true
}

// idemWriteTimeout bounds a write of an idempotency record.
const idemWriteTimeout = 2 * time.Second

// pinsIdem reports whether an attempt that sent status and ended with o pins its key. A stream
// that broke pins it only if it had produced output: an empty answer is better run again than
// replayed for a day.
func (c *call) pinsIdem(status int, o outcome) bool {
	return status >= 200 && status <= 299 &&
		(o == outcomeComplete || (o == outcomeStreamError && c.meter.Result().Produced()))
}

// finishIdem records how an idempotent attempt ended, before its settlement: the answer the
// caller got, when it pins the key and pinBeforeAnswer has not, or the move to the next attempt.
func (s *Server) finishIdem(ctx context.Context, c *call) {
	if c.idemPinned {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, idemWriteTimeout)
	defer cancel()
	ic := c.idem
	pins := c.pinsIdem(c.rw.status, c.outcome)
	if !pins && c.superseded {
		// Not moved on: a retry of a superseded message would replace the newer one.
		if err := s.writeIdemRecord(ctx, c, "", "superseded", "1"); errors.Is(err, errIdemMovedOn) {
			c.log.Info("superseded idempotent attempt not recorded: the key moved on to a later attempt while it ran", zap.Error(err))
		} else if err != nil {
			c.log.Warn("superseded idempotent attempt not recorded; a retry may run it again", zap.Error(err))
		}
		return
	}
	if !pins {
		if err := s.advanceIdem(ctx, ic, ic.attempt, true); errors.Is(err, errAttemptForwarded) {
			c.log.Warn("idempotency attempt not advanced: another attempt of its key is being forwarded under its mark (Redis lost the key's counter)",
				zap.Error(err))
		} else if err != nil {
			c.log.Warn("idempotency attempt not advanced; the next retry advances it", zap.Error(err))
		}
		return
	}
	if err := s.storeIdemAnswer(ctx, c, c.rw.status); errors.Is(err, errIdemMovedOn) {
		c.log.Info("idempotent answer not stored: the key moved on to a later attempt while this one ran", zap.Error(err))
	} else if err != nil {
		c.log.Error("idempotent answer not stored; a retry is refused 409 idempotent_response_lost, not run again", zap.Error(err))
		s.recordAnsweredAttempt(ctx, c, c.outcome)
	}
}

// storeIdemAnswer pins the key on this attempt with the answer the caller was sent (status, the
// headers, and the bytes rw kept), or marks it too large to keep. It replaces what an earlier
// store of the attempt's answer wrote (storedAnswerFields): pinned at the provider's error
// event, an answer that then outgrew max_replay_len or its caller's share with the final event
// after it was marked too large beside the answer already kept, which every retry was told was
// not kept while Redis held it for replay_ttl.
func (s *Server) storeIdemAnswer(ctx context.Context, c *call, status int) error {
	rw := c.rw
	fields := []any{"run", c.runID, "status", status, "ctype", rw.Header().Get("Content-Type")}
	hdrs, _ := json.Marshal(replayableHeaders(rw.Header())) // a map of strings: cannot fail
	// The headers are part of the stored answer: max_replay_len bounds them with the body, or
	// an upstream's megabytes of headers on a small body would be kept for replay_ttl.
	size := int64(len(hdrs) + rw.buf.Len())
	switch {
	case rw.over || size > rw.limit:
		fields = append(fields, "large", "1")
	case !s.replayRoom(ctx, c, size+config.ReplayRecordOverhead):
		// Replays of it answer 409, as for an answer too large: it ran, and is not run again.
		fields = append(fields, "large", "1", "large_why", "share")
	default:
		if hdrs != nil {
			fields = append(fields, "hdrs", hdrs)
		}
		fields = append(fields, "resp", rw.buf.Bytes())
	}
	// An earlier attempt's superseded mark goes: this answer is the key's now. Left, it refused
	// every retry of this charged, answered attempt 409 superseded, as though a newer message had
	// replaced it (an attempt run past the mark, its record unread under dedup.fail_open).
	if err := s.writeIdemRecord(ctx, c, storedAnswerFields+" superseded", fields...); err != nil {
		return fmt.Errorf("store idempotent answer: %w", err)
	}
	return nil
}

// replayRoom counts c's answer, size bytes, among its caller's answers kept for replays, and
// reports false, counting nothing, when they would pass dedup.max_replay_bytes_per_caller. An
// answer c stored before (pinned at the provider's error event, now at the final event after
// it: one record) counts only what it grew by; counted whole each time, it took its room
// twice. A count that fails says true: the record's write that follows goes to the same Redis,
// and fails or lands as it did before the bound. An answer whose record write then fails stays
// counted until its bucket ages out (stored again when the call ends, it counts no more): the
// bound errs on the side of keeping less.
func (s *Server) replayRoom(ctx context.Context, c *call, size int64) bool {
	more := size - c.idemCounted
	if more <= 0 {
		return true
	}
	ttl := s.cfg.Dedup.ReplayTTL.Milliseconds()
	width := max(1, (ttl+replayBuckets-1)/replayBuckets)
	ok, err := replayRoomScript.Run(ctx, s.dedupRDB, []string{s.keys.ReplayBytes(c.user.ID)},
		more, s.cfg.Dedup.ReplayBytesPerCaller(), width, replayBuckets+1).Int()
	if err != nil {
		c.log.Warn("caller's stored answers not counted; this one is stored regardless", zap.Error(err))
		return true
	}
	if ok == 1 {
		c.idemCounted = size
	}
	return ok == 1
}

// replayBuckets is how many time buckets a caller's count of stored answers splits replay_ttl
// into: one more is kept, so an answer counts until it has surely expired, and at most a
// bucket's width longer.
const replayBuckets = 24

// replayRoomScript adds ARGV[1] bytes to the caller's count KEYS[1] (a hash: time bucket ->
// bytes stored in it) unless the buckets not yet aged out would then pass ARGV[2]; ARGV[3] is
// a bucket's width in ms, ARGV[4] how many are kept. Buckets older than that are dropped: their
// answers have expired. Returns 1 when counted, 0 when refused.
var replayRoomScript = redis.NewScript(`
local t = redis.call('TIME')
local width, kept = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = math.floor((tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) / width)
local held = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i]) <= now - kept then redis.call('HDEL', KEYS[1], all[i]) else held = held + tonumber(all[i + 1]) end
end
if held + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[1], string.format('%d', now), ARGV[1])
redis.call('PEXPIRE', KEYS[1], string.format('%d', (kept + 1) * width))
return 1`)

// errIdemMovedOn: an attempt's record write was refused because the key is no longer this
// attempt's. Its hold was settled under its call (the reconciler took its process for dead: a
// pause, a partition, a call past its hold) and a retry moved the key to a later attempt, or
// another attempt pinned it. The key's record is the later attempt's to write.
var errIdemMovedOn = errors.New("the key's record belongs to a later attempt")

// idemWriteScript writes how an attempt ended into its key's record, only while the key is
// still the attempt's: its attempt counter has not moved past it, and no other attempt has
// pinned it. KEYS record; ARGV run id, attempt, body hash, replay ttl ms, the fields to delete
// first (space-separated), then field/value pairs. The body is set to the attempt's
// (idemCall.writtenHash): if missing, as startIdem's write may have failed, and a record
// without it would replay this answer to a different body under the same key; and if another,
// as it is when the attempt was admitted with the record unread (dedup.fail_open): kept, the
// answer of this body was replayed to the retries of the key's first body, and this body's own
// retries were refused 422 (TestIdemAnswerOfAnotherBodyRunUnderFailOpenIsNotReplayedToTheFirst).
// The mark of a forward (claimForward) is dropped: the attempt has pinned
// the key or ended. Any attempt's mark, unlike advanceScript: a key pinned or superseded runs
// no retry that a mark would have to stop. Returns 0 when refused.
//
// Unguarded, an attempt that outlived its hold, ending after a retry had run the next attempt
// to its end and pinned the key, replaced that answer with its own: every later replay was the
// answer of a run the key had moved past, not the one its caller was given.
var idemWriteScript = redis.NewScript(`
local run = redis.call('HGET', KEYS[1], 'run')
if run and run ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0') > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'body', ARGV[3])
redis.call('HDEL', KEYS[1], 'fwd', 'fwd_until')
for f in string.gmatch(ARGV[5], '%S+') do redis.call('HDEL', KEYS[1], f) end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1`)

// storedAnswerFields are the fields of a record that one store of an answer writes, some or
// others: a later store of the same attempt's answer deletes them before it writes its own.
const storedAnswerFields = "hdrs resp large large_why"

// writeIdemRecord deletes the fields named in drop (space-separated) from c's key's record and
// writes fields (field/value pairs) into it while the key is still c's attempt's
// (idemWriteScript), else fails with errIdemMovedOn.
func (s *Server) writeIdemRecord(ctx context.Context, c *call, drop string, fields ...any) error {
	ic := c.idem
	args := append([]any{c.runID, ic.attempt, ic.writtenHash(), s.cfg.Dedup.ReplayTTL.Milliseconds(), drop}, fields...)
	n, err := idemWriteScript.Run(ctx, s.dedupRDB, []string{ic.record}, args...).Int()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w (attempt %d, run %s)", errIdemMovedOn, ic.attempt, c.runID)
	}
	return nil
}
