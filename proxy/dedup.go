package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
)

// How a duplicate is answered. X-Should-Retry is the OpenAI SDKs' override of their own retry
// rule (they retry every 409): a duplicate of a running request must not be retried, since a
// retry after the original finished would run it a second time; a request still in progress
// under an Idempotency-Key should be, since the retry gets the stored answer.
const shouldRetryHeader = "X-Should-Retry"

// errDuplicate names the way out too: the same body sent at once on purpose (samples at a
// temperature, two services of one account asking the same) is refused like a double click, and
// a caller told only that it duplicates a running request had no way to run it.
func errDuplicate(runID string) *apiError {
	return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "duplicate", RunID: runID,
		Message: "The same request is already running (run " + runID + "); this one was not run and not charged. " +
			"To run the same request more than once at a time, send each with its own Idempotency-Key."}
}

var errDedupDown = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "dedup_unavailable",
	Message:    "Duplicate detection is unavailable, so the call was not made rather than risk running it twice. Retry shortly.",
	RetryAfter: time.Second}

// writeDuplicate sends a duplicate-family answer with the retry hint that fits it.
func (s *Server) writeDuplicate(w http.ResponseWriter, e *apiError, retry bool) {
	s.metrics.Duplicates.WithLabelValues(e.Code).Inc()
	if retry {
		w.Header().Set(shouldRetryHeader, "true")
	} else {
		w.Header().Set(shouldRetryHeader, "false")
	}
	writeError(w, e)
}

// errStoreDown marks a fingerprint check that failed on MySQL rather than Redis: that is
// billing down, not dedup down, and fail_open does not cover it.
type errStoreDown struct{ error }

func (e errStoreDown) Unwrap() error { return e.error }

// takeOverScript moves a fingerprint from a run that has ended to the new one, only if no
// other request moved it first.
var takeOverScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0`)

// endScript gives a fingerprint back, only if it still names the run that ends.
var endScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// checkFingerprint answers a plain request whose body the same user sent moments ago while
// that first request still runs. It returns the status it answered with, or 0 to go on.
// Redis out of reach is a refusal unless dedup.fail_open: a silent double run costs money.
// Its steps run under actx, the call's admission budget.
func (s *Server) checkFingerprint(w http.ResponseWriter, r *http.Request, actx context.Context, c *call, bodyHash string,
	refuse func(*apiError, string, error) int) int {
	orig, err := s.fingerprint(actx, c.user.ID, bodyHash, c.runID)
	var dbDown errStoreDown
	switch {
	case err != nil && r.Context().Err() != nil:
		c.outcome = outcomeRefused
		e, why := ended(r.Context(), "during the duplicate check; hold released")
		logRefusal(c.log, e, why, err)
		return answerClientClosed(w, r)
	case errors.As(err, &dbDown):
		c.outcome = outcomeRefused
		return refuse(errBillingDown, "fingerprint check failed", err)
	case err != nil && !s.cfg.Dedup.FailOpen:
		c.outcome = outcomeRefused
		return refuse(errDedupDown, "fingerprint check failed; refusing rather than risk a double run", err)
	case err != nil:
		c.log.Warn("fingerprint check failed; going on (fail_open)", zap.Error(err))
	case orig != "":
		c.outcome = outcomeDuplicate
		e := errDuplicate(orig)
		logRefusal(c.log, e, "duplicate of a running request", nil, zap.String("of_run", orig))
		s.writeDuplicate(w, e, false)
		return e.Status
	default:
		c.fpKey = s.keys.Dedup(c.user.ID, bodyHash)
	}
	return 0
}

// claimReleaseTimeout bounds giving back what a call claimed against duplicates (its
// fingerprint, its session's running mark: answerFinal): it is done before the end of the
// call's answer goes out, so the caller waits for it. One not given back lapses on its own.
const claimReleaseTimeout = time.Second

// endFingerprint gives back the fingerprint of a plain call whose answer is final, before
// that answer's end reaches the caller: the hold is settled only afterwards, in the
// background, and a caller that asks the same again the moment it has its answer must not be
// told it duplicates a request still running. Safe to call more than once.
func (s *Server) endFingerprint(ctx context.Context, c *call) {
	if c.fpKey == "" {
		return
	}
	key := c.fpKey
	c.fpKey = ""
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimReleaseTimeout)
	defer cancel()
	s.giveFingerprintBack(ctx, c, key)
}

// giveFingerprintBack deletes the fingerprint key if it still names c's run. A lone script,
// which go-redis sends again on a lost connection: repeating it is harmless.
func (s *Server) giveFingerprintBack(ctx context.Context, c *call, key string) {
	if err := endScript.Run(ctx, s.dedupRDB, []string{key}, c.runID).Err(); err != nil {
		c.log.Warn("fingerprint not given back; it lapses with the window", zap.Error(err))
	}
}

// tallyWithFingerprint tallies a plain call whose whole answer is in hand (st: what it is
// charged as it stands) in the round trip that gives its fingerprint back (endFingerprint)
// before the end of the answer goes out, rather than in one of its own after it: on a saturated
// box each round trip to Redis costs the gateway two syscalls and a wake-up, and the tally's own
// was a tenth of the gateway's CPU profile. Only for a call that holds a fingerprint and a tally
// kept in the same Redis, and, on a Redis Cluster, in one transaction's reach
// (runstate.Tally.JoinsAdd): the fingerprint is in its user's hash slot, the tally in its
// run's, and a Cluster client refuses such a MULTI/EXEC whole — the call was never tallied, and
// its fingerprint was given back only by the retry alone. Apart, the tally and the give-back
// are two round trips, as with dedup in a Redis of its own: neither needs the other's
// atomicity (the give-back is a compare-and-delete of c's run id, safe to repeat). What the settlement finds beyond st (events after a stream's final
// one) is set in the tally then, with the rest of the call's figures (finishPlainCall).
//
// One attempt of this round trip; a tally that failed is tried again beside the settlement
// (finishPlainCall), its figures set, not added (runstate.Tally.RecordCallWith), so a write
// that landed unanswered, or lands late, still counts the call once, and, numbered
// (c.tallyWrites), one that lands after a later write leaves that write's figures. Safe to call
// more than once.
func (s *Server) tallyWithFingerprint(ctx context.Context, c *call, st holds.Settlement) {
	if c.fpKey == "" || !s.tally.JoinsAdd(s.dedupRDB, c.runID, c.fpKey) {
		return
	}
	key := c.fpKey
	c.fpKey = ""
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimReleaseTimeout)
	defer cancel()
	c.tallyWrites++
	err := s.tally.RecordCallWith(ctx, c.runID, c.tallyWrites, st.Usage, st.CostMicro, st.Estimated, s.billedPrices(c, st),
		func(p redis.Pipeliner) { endScript.Eval(ctx, p, []string{key}, c.runID) })
	if err != nil {
		s.tallyFailed(c, st, err)
		// The tally is tried again beside the settlement (finishPlainCall). The
		// fingerprint must still go back before the answer's end: left to lapse with the
		// window, the same request sent at once was refused 409 duplicate of a call whose
		// answer the caller had, until its settlement committed. Given back alone, within
		// what is left of the same bound; a release that already ran finds nothing to delete.
		s.giveFingerprintBack(ctx, c, key)
		c.tallyMissed = true
		return
	}
	c.tallied, c.talliedAs = true, &st
}

// maxFingerprintRounds bounds fingerprint's tries when the key keeps changing between its
// commands (expired, or taken over by another resend): past it the check fails, which
// dedup.fail_open decides, rather than spin.
const maxFingerprintRounds = 4

// fingerprint is the duplicate window for requests that carry neither an Idempotency-Key nor
// a session (DESIGN §6): SET dedup:{user}:sha256(route, body) <run_id> NX PX window. It returns the
// run a request duplicates, or "" when this request registered itself and may run.
//
// The common case costs one SET NX. Only when the fingerprint is taken does the check look
// further: the original is a duplicate's target only while it is still running (its hold is
// live by the database clock); once it has ended, a resend within the window is a new request
// — the caller has its answer and asked again — and takes the fingerprint over, by
// compare-and-set so two resends cannot both take it.
func (s *Server) fingerprint(ctx context.Context, userID uint64, bodyHash, runID string) (string, error) {
	key := s.keys.Dedup(userID, bodyHash)
	window := s.cfg.Dedup.Window
	for range maxFingerprintRounds {
		rctx, cancel := redisStep(ctx)
		ok, err := s.dedupRDB.SetNX(rctx, key, runID, window).Result()
		cancel()
		if err != nil {
			return "", fmt.Errorf("fingerprint: %w", err)
		}
		if ok {
			return "", nil
		}
		rctx, cancel = redisStep(ctx)
		orig, err := s.dedupRDB.Get(rctx, key).Result()
		cancel()
		if errors.Is(err, redis.Nil) {
			continue // expired between the two commands
		}
		if err != nil {
			return "", fmt.Errorf("fingerprint: %w", err)
		}
		if orig == runID {
			// Our own SET NX, whose reply was lost and which the client sent again.
			return "", nil
		}
		sctx, cancel := s.storeContext(ctx)
		s.beforeStep(sctx, stepFingerprint)
		live, err := s.store.RunLive(sctx, orig)
		cancel()
		if err != nil {
			return "", errStoreDown{err}
		}
		if live {
			return orig, nil
		}
		rctx, cancel = redisStep(ctx)
		n, err := takeOverScript.Run(rctx, s.dedupRDB, []string{key}, orig, runID, window.Milliseconds()).Int()
		cancel()
		if err != nil {
			return "", fmt.Errorf("fingerprint take-over: %w", err)
		}
		if n == 1 {
			return "", nil
		}
	}
	return "", errors.New("fingerprint: key changing under contention")
}

// respWriter remembers what was sent to the caller: whether anything was (so a superseded
// call knows if it can still answer with an error), the status, and for an idempotent request
// a copy of the bytes, up to limit, for later replays. Unwrap lets http.ResponseController
// reach the real writer's Flush.
type respWriter struct {
	http.ResponseWriter
	status  int
	capture bool
	limit   int64
	buf     bytes.Buffer
	over    bool // the response outgrew limit; nothing is kept
}

func (w *respWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *respWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	if w.capture {
		w.keep(b[:n])
	}
	return n, err
}

// keep adds b to the copy kept for replays, up to limit.
func (w *respWriter) keep(b []byte) {
	if w.over {
		return
	}
	if int64(w.buf.Len()+len(b)) > w.limit {
		w.over = true
		w.buf = bytes.Buffer{}
		return
	}
	w.buf.Write(b)
}

func (w *respWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
