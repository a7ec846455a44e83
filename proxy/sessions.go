package proxy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/metering/runstate"
)

// SessionHeader names a conversation. With it, resending the message the session's running
// run is already answering is a duplicate (409 already_running), and sending a different one
// replaces that run: the old run is cancelled wherever it runs and settled by its usage.
const SessionHeader = "X-Session-Id"

// errSuperseded is the cause a run's context is cancelled with when a newer message of its
// session replaced it.
var errSuperseded = errors.New("superseded by a newer message of the same session")

func errAlreadyRunning(runID string) *apiError {
	return &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "already_running", RunID: runID,
		Message: "This session is already answering the same message (run " + runID + "); this request was not run and not charged."}
}

var errSupersededAnswer = &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "superseded",
	Message: "A newer message of the same session replaced this call; it was stopped and charged for what it used."}

// sessionMessageHash fingerprints the last user message of a request: what "the same
// message" means for a session. The raw JSON of the message's content is hashed, so a string
// and its array-of-parts form differ; a resend of one request is byte-identical anyway.
// Bodies without messages (completions, embeddings) hash their prompt or input.
func sessionMessageHash(f metering.Format, body []byte) [32]byte {
	root := gjson.ParseBytes(body)
	var last gjson.Result
	switch f {
	case metering.FormatCompletions:
		last = root.Get("prompt")
	case metering.FormatEmbeddings:
		last = root.Get("input")
	default:
		path := "messages"
		if f == metering.FormatResponses {
			path = "input"
		}
		list := root.Get(path)
		if list.Type == gjson.String {
			last = list
			break
		}
		list.ForEach(func(_, m gjson.Result) bool {
			if m.Get("role").String() == "user" {
				last = m.Get("content")
			}
			return true
		})
	}
	if !last.Exists() {
		return sha256.Sum256(body)
	}
	return sha256.Sum256([]byte(last.Raw))
}

// cancelBus delivers "stop run X" across gateway processes (DESIGN §6): the process that
// replaces a session's run publishes on cancel:{run_id}; every process holds one pattern
// subscription over all such channels and cancels the run if it serves it. One subscription
// per process, not per run: go-redis gives each PubSub its own connection.
//
// The subscription starts with the first session call a process serves, and a run is
// registered before its session claim commits, so a cancel published after the claim always
// finds it. Pub/sub is fire-and-forget: a cancel sent while this process's subscription is
// reconnecting is lost, and the old run then completes and is charged in full. That is the
// accepted failure mode; the reconciler does not need to know about it.
type cancelBus struct {
	rdb  redis.UniversalClient
	keys runstate.Keys
	log  *zap.Logger

	// subscribing serialises starts and is never held with mu: a subscription waits on Redis,
	// and registering runs and delivering cancels must not wait behind it. failedAt (under
	// subscribing) is the last failed start: with Redis down, calls within retryAfter of it
	// fail at once instead of each waiting out its own attempt in turn.
	subscribing sync.Mutex
	failedAt    time.Time
	retryAfter  time.Duration

	mu      sync.Mutex
	runs    map[string]cancellable
	ps      *redis.PubSub
	started bool
	closed  bool
}

// Bounds of one attempt to subscribe, and the pause after a failed one.
const (
	subscribeTimeout = 2 * time.Second
	startRetry       = time.Second
)

// cancellable is a run registered on the bus: how to stop it, and the logger of its call,
// whose line says it was stopped under the request_id its caller was given.
type cancellable struct {
	cancel context.CancelCauseFunc
	log    *zap.Logger
}

var errBusDown = errors.New("cancel bus: subscription failed moments ago; not retried yet")

func newCancelBus(rdb redis.UniversalClient, keys runstate.Keys, log *zap.Logger) *cancelBus {
	return &cancelBus{rdb: rdb, keys: keys, log: log, runs: map[string]cancellable{}, retryAfter: startRetry}
}

// register makes runID cancellable from any process until unregister; log is its call's
// (with its run_id and request_id), for the line that says it was stopped. The returned error
// says the subscription could not be started: the run still runs, but cannot be stopped by
// a replacing message.
func (b *cancelBus) register(ctx context.Context, runID string, cancel context.CancelCauseFunc, log *zap.Logger) error {
	err := b.start(ctx)
	b.mu.Lock()
	b.runs[runID] = cancellable{cancel: cancel, log: log}
	b.mu.Unlock()
	return err
}

func (b *cancelBus) unregister(runID string) {
	b.mu.Lock()
	delete(b.runs, runID)
	b.mu.Unlock()
}

// start subscribes once and waits for Redis to confirm it, so no cancel published after a
// claim can arrive before the subscription exists.
func (b *cancelBus) start(ctx context.Context) error {
	if b.running() {
		return nil
	}
	b.subscribing.Lock()
	defer b.subscribing.Unlock()
	if b.running() {
		return nil
	}
	if !b.failedAt.IsZero() && time.Since(b.failedAt) < b.retryAfter {
		return errBusDown
	}
	// Not the caller's context: a client that leaves mid-attempt must not count as Redis
	// failing, which would leave the runs of the next second uncancellable.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), subscribeTimeout)
	defer cancel()
	ps := b.rdb.PSubscribe(ctx, b.keys.Cancel("*"))
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		b.failedAt = time.Now()
		return fmt.Errorf("cancel bus: subscribe: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ps.Close()
	}
	b.ps, b.started = ps, true
	go b.loop(ps.Channel())
	return nil
}

// running reports whether the bus needs no start: subscribed, or closed.
func (b *cancelBus) running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started || b.closed
}

func (b *cancelBus) loop(ch <-chan *redis.Message) {
	prefix, suffix := b.keys.Cancel(""), "}"
	prefix = strings.TrimSuffix(prefix, suffix)
	for msg := range ch {
		b.deliver(strings.TrimSuffix(strings.TrimPrefix(msg.Channel, prefix), suffix))
	}
}

// deliver cancels runID if this process serves it.
func (b *cancelBus) deliver(runID string) {
	b.mu.Lock()
	run, ok := b.runs[runID]
	b.mu.Unlock()
	if ok {
		run.log.Info("run cancelled: its session moved on")
		run.cancel(errSuperseded)
	}
}

// publish asks whichever process serves runID to stop it: a step on the caller's path (a
// newer message waits for it), bounded as one.
func (b *cancelBus) publish(ctx context.Context, runID string) error {
	ctx, cancel := redisStep(ctx)
	defer cancel()
	return b.rdb.Publish(ctx, b.keys.Cancel(runID), "superseded").Err()
}

func (b *cancelBus) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.ps == nil {
		return nil
	}
	return b.ps.Close()
}

// endSessionCall marks a session's call whose answer is final, before that answer's end
// reaches the caller (claimSession reads the mark). Safe to call more than once.
func (s *Server) endSessionCall(ctx context.Context, c *call) {
	if !c.sessionClaimed {
		return
	}
	c.sessionClaimed = false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimReleaseTimeout)
	defer cancel()
	if err := s.dedupRDB.Set(ctx, s.keys.SessionDone(c.runID), "1", s.cfg.Holds.HoldTTL).Err(); err != nil {
		c.log.Warn("session call's end not marked; the same message again is already_running until it settles", zap.Error(err))
	}
}

// claimSession registers c's run as its session's current run (DESIGN §6). It returns an
// answer when the request must not run: a duplicate of the session's running message, or
// billing down (with the error behind it, for the refusal's line). A replaced run is told to
// stop. message is the request's sessionMessageHash, of the body as the caller sent it.
func (s *Server) claimSession(ctx context.Context, c *call, sessionID string, message [32]byte) (*apiError, error) {
	sctx, cancel := s.storeContext(ctx)
	s.beforeStep(sctx, stepSessionClaim)
	claim, err := s.store.ClaimSession(sctx, c.user.ID, sessionID, c.runID, message)
	cancel()
	if err != nil {
		return s.sessionClaimFailed(ctx, c, err)
	}
	if claim.Duplicate {
		// The current run's hold is live, but its answer may be final already, its settlement
		// still on its way: then the same message again is a new request (a regenerate).
		rctx, cancel := redisStep(ctx)
		done, err := s.dedupRDB.Exists(rctx, s.keys.SessionDone(claim.Current)).Result()
		cancel()
		if err == nil && done == 1 {
			sctx, cancel := s.storeContext(ctx)
			s.beforeStep(sctx, stepSessionClaim)
			claim, err = s.store.ClaimSessionPast(sctx, c.user.ID, sessionID, c.runID, message, claim.Current)
			cancel()
			if err != nil {
				return s.sessionClaimFailed(ctx, c, err)
			}
		}
	}
	if claim.Duplicate {
		c.outcome = outcomeDuplicate
		return errAlreadyRunning(claim.Current), nil
	}
	c.sessionClaimed = true
	if claim.Replaced != "" {
		// The claim is committed: the replaced run must stop whether or not this request's
		// caller is still there to run the new one.
		if err := s.cancels.publish(context.WithoutCancel(ctx), claim.Replaced); err != nil {
			c.log.Warn("cancel of the replaced run not sent; it runs to its end and is charged", zap.String("replaced", claim.Replaced), zap.Error(err))
		}
	}
	return nil, nil
}

// sessionClaimFailed refuses a call whose session claim failed (the caller logs the refusal,
// with the error returned): billing is down, unless the caller left while it waited (the
// failure is then its cancelled context). The admission budget running out is billing down.
func (s *Server) sessionClaimFailed(ctx context.Context, c *call, err error) (*apiError, error) {
	c.outcome = outcomeRefused
	if callerEnded(ctx) {
		e, why := ended(ctx, "during the session claim")
		return e, fmt.Errorf("%s: %w", why, err)
	}
	return errBillingDown, fmt.Errorf("session claim: %w", err)
}

// answerSuperseded tells a caller still connected that its call was stopped because a newer
// message of its session replaced it: an error answer when nothing was sent yet, an error
// event at the end of a stream already under way.
func (s *Server) answerSuperseded(c *call) int {
	rw := c.rw
	if rw.status == 0 {
		rw.Header().Set(shouldRetryHeader, "false") // a retry would replace the newer message
		writeError(rw, errSupersededAnswer)
		return errSupersededAnswer.Status
	}
	if isEventStream(rw.Header().Get("Content-Type")) {
		rc := http.NewResponseController(rw)
		bound := s.boundWrites(rc)
		_, _ = bound.write(rw, streamErrorEvent(c.req.route.format, errSupersededAnswer))
		_ = rc.Flush()
	}
	return rw.status
}
