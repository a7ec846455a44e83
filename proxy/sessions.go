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

	"github.com/tollgate/tollgate/holds"
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
// down (Redis restarted, the connection cut, a start that failed) reached no one, and the old
// run went on to its end, charged in full beside the new one. So publish first leaves a mark
// (Keys.Cancelled, markTTL), and each time the subscription is made again the bus reads the
// marks of the runs it serves (sweep): a cancel sent meanwhile stops its run once this process
// reaches Redis again. The reconciler does not need to know about any of it.
type cancelBus struct {
	rdb     redis.UniversalClient
	keys    runstate.Keys
	markTTL time.Duration
	log     *zap.Logger

	// subscribing serialises starts and is never held with mu: a subscription waits on Redis,
	// and registering runs and delivering cancels must not wait behind it. failedAt (under
	// subscribing) is the last failed start: with Redis down, calls within retryAfter of it
	// fail at once instead of each waiting out its own attempt in turn. retrying (under
	// subscribing): a start is due in the background (retryLater).
	subscribing sync.Mutex
	failedAt    time.Time
	retryAfter  time.Duration
	retrying    bool

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
	// session is the run's session once its claim has committed (claimed), for the check
	// that finds a run replaced though its cancel never came (checkReplaced); nil before.
	session *holds.SessionRef
	// answered: the run's answer is whole (answered), its last bytes on their way. A cancel
	// then has nothing left to stop and would only cut the answer's end.
	answered bool
}

var errBusDown = errors.New("cancel bus: subscription failed moments ago; not retried yet")

// newCancelBus is the bus of a process; markTTL is how long a cancel's mark is kept, as long
// as a session call's hold lives (holds.hold_ttl): no run it names outlives it.
func newCancelBus(rdb redis.UniversalClient, keys runstate.Keys, markTTL time.Duration, log *zap.Logger) *cancelBus {
	return &cancelBus{rdb: rdb, keys: keys, markTTL: markTTL, log: log, runs: map[string]cancellable{}, retryAfter: startRetry}
}

// register makes runID cancellable from any process until unregister; log is its call's
// (with its run_id and request_id), for the line that says it was stopped. The returned error
// says the subscription could not be started: the run still runs, and a replacing message
// stops it only once the bus subscribes (retryLater, then loop's sweep).
func (b *cancelBus) register(ctx context.Context, runID string, cancel context.CancelCauseFunc, log *zap.Logger) error {
	err := b.start(ctx)
	b.mu.Lock()
	b.runs[runID] = cancellable{cancel: cancel, log: log}
	b.mu.Unlock()
	return err
}

// claimed records that runID's session claim committed: from now on the session's row names
// runID or a newer message's run, and checkReplaced may judge it by the row.
func (b *cancelBus) claimed(runID string, session holds.SessionRef) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if run, ok := b.runs[runID]; ok {
		run.session = &session
		b.runs[runID] = run
	}
}

// answered records that runID's answer is whole: a newer message, or the same one again (a
// regenerate), may take its session now, and neither a cancel nor the session check stops it.
func (b *cancelBus) answered(runID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if run, ok := b.runs[runID]; ok {
		run.answered = true
		b.runs[runID] = run
	}
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
	ps := b.rdb.PSubscribe(ctx, cancelPattern(b.keys))
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		b.failedAt = time.Now()
		b.retryLater()
		return fmt.Errorf("cancel bus: subscribe: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ps.Close()
	}
	b.ps, b.started = ps, true
	go b.loop(ps.ChannelWithSubscriptions())
	return nil
}

// cancelPattern is the pattern of every run's cancel channel (Keys.Cancel), with the key
// prefix matched literally: redis_key_prefix may hold any bytes, and one holding a glob
// character of Redis's (a "[eu]" region tag, a backslash) read as a pattern matched other
// channels than the gateway's own, so no cancel ever reached the bus and a session run
// replaced by a newer message on another process ran on, charged, until the session check.
func cancelPattern(k runstate.Keys) string {
	lit := strings.TrimSuffix(k.Cancel(""), "}")
	var p strings.Builder
	for i := 0; i < len(lit); i++ {
		if strings.IndexByte(`*?[]\`, lit[i]) >= 0 {
			p.WriteByte('\\')
		}
		p.WriteByte(lit[i])
	}
	return p.String() + "*}"
}

// retryLater starts the subscription again retryAfter from now, in the background, if runs
// are registered by then (b.subscribing held): those registered while it was down are swept
// once it is made (loop), though no later session call comes to start it. A start that fails
// again retries later again.
func (b *cancelBus) retryLater() {
	if b.retrying {
		return
	}
	b.retrying = true
	time.AfterFunc(b.retryAfter, func() {
		b.subscribing.Lock()
		b.retrying = false
		b.subscribing.Unlock()
		b.mu.Lock()
		waiting := len(b.runs) > 0
		b.mu.Unlock()
		if waiting {
			_ = b.start(context.Background()) // a failure is retried (retryLater)
		}
	})
}

// running reports whether the bus needs no start: subscribed, or closed.
func (b *cancelBus) running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started || b.closed
}

// loop delivers the cancels the subscription receives. Runs registered while no subscription
// listened (a start that failed) are swept as it begins, and all of them again each time
// go-redis makes the subscription anew after its connection broke (a *redis.Subscription):
// the cancels published in between reached no one.
func (b *cancelBus) loop(ch <-chan any) {
	prefix, suffix := b.keys.Cancel(""), "}"
	prefix = strings.TrimSuffix(prefix, suffix)
	b.sweep()
	for msg := range ch {
		switch m := msg.(type) {
		case *redis.Message:
			b.deliver(strings.TrimSuffix(strings.TrimPrefix(m.Channel, prefix), suffix))
		case *redis.Subscription:
			if m.Kind == "psubscribe" {
				b.sweep()
			}
		}
	}
}

// sweep cancels every run this process serves whose cancel mark is set: replaced while the
// subscription was down. Bounded as the subscription's start; a sweep that fails leaves those
// runs to run on (logged), as a cancel lost on the way would.
func (b *cancelBus) sweep() {
	b.mu.Lock()
	ids := make([]string, 0, len(b.runs))
	for id := range b.runs {
		ids = append(ids, id)
	}
	b.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	marks := make([]*redis.IntCmd, len(ids))
	if _, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			marks[i] = p.Exists(ctx, b.keys.Cancelled(id))
		}
		return nil
	}); err != nil {
		b.log.Warn("cancel bus: cancels sent while it was not subscribed not read; the runs they name go on",
			zap.Int("runs", len(ids)), zap.Error(err))
	}
	for i, m := range marks {
		if m.Err() == nil && m.Val() == 1 {
			b.deliver(ids[i])
		}
	}
}

// deliver cancels runID if this process serves it and its answer is not yet whole, and
// reports whether it did. A run is cancelled once: a later cancel of it (the pub/sub echo of
// one delivered here at once, a sweep) finds it gone.
func (b *cancelBus) deliver(runID string) bool {
	b.mu.Lock()
	run, ok := b.runs[runID]
	delete(b.runs, runID)
	b.mu.Unlock()
	if ok && !run.answered {
		run.log.Info("run cancelled: its session moved on")
		run.cancel(errSuperseded)
	}
	return ok && !run.answered
}

// checkReplaced stops every claimed run this process serves whose session's row now names
// another run and whose hold is still open, as a claim's cancel would have, and returns how
// many it stopped. Pub/sub and its marks stop a replaced run
// only if the newer message's process lived to publish after its claim committed: one
// killed in between (or cut off from Redis then) left the replaced run going to its end,
// charged in full beside the newer message. The row is the truth; read every
// heartbeat_interval (checkSessions), it stops such a run within that.
func (b *cancelBus) checkReplaced(ctx context.Context, rows sessionRows) (int, error) {
	b.mu.Lock()
	serving := make(map[holds.SessionRef][]string)
	refs := make([]holds.SessionRef, 0, len(b.runs))
	for id, run := range b.runs {
		if run.session == nil || run.answered {
			continue
		}
		if _, seen := serving[*run.session]; !seen {
			refs = append(refs, *run.session)
		}
		serving[*run.session] = append(serving[*run.session], id)
	}
	b.mu.Unlock()
	if len(refs) == 0 {
		return 0, nil
	}
	now, err := rows.CurrentSessionRuns(ctx, refs)
	if err != nil {
		return 0, err
	}
	var replaced []string
	current := make(map[string]string) // a replaced run -> its session's current run
	for ref, ids := range serving {
		cur, ok := now[ref]
		if !ok {
			continue // pruned: its run had ended, so none of these is running on
		}
		for _, id := range ids {
			if id != cur {
				replaced = append(replaced, id)
				current[id] = cur
			}
		}
	}
	if len(replaced) == 0 {
		return 0, nil
	}
	// A run settled before the newer message's claim (by a reconciler that took its process
	// for dead: paused past its holds' expiry) was not the claim's to cancel (its Replaced is
	// empty), and its caller, still connected, gets its whole answer (README Known limits).
	open, err := rows.OpenRuns(ctx, replaced)
	if err != nil {
		return 0, err
	}
	stopped := 0
	for _, id := range replaced {
		if open[id] && b.deliver(id) {
			b.log.Warn("session run stopped by the session check: a newer message took its session, and no cancel had reached it",
				zap.String("run_id", id), zap.String("current_run", current[id]))
			stopped++
		}
	}
	return stopped, nil
}

// sessionRows is what the session check reads of the database (holds.Store).
type sessionRows interface {
	CurrentSessionRuns(ctx context.Context, refs []holds.SessionRef) (map[holds.SessionRef]string, error)
	OpenRuns(ctx context.Context, runIDs []string) (map[string]bool, error)
}

// publish asks whichever process serves runID to stop it: a step on the caller's path (a
// newer message waits for it), bounded as one, and one round trip: the mark and the message go
// in one pipeline, the mark first, so a process that was not subscribed as the message went
// out finds it when it subscribes again (sweep). sent reports the message went out, with or
// without its mark (a Redis refusing writes still publishes).
func (b *cancelBus) publish(ctx context.Context, runID string) (sent bool, err error) {
	ctx, cancel := redisStep(ctx)
	defer cancel()
	var mark *redis.StatusCmd
	var pub *redis.IntCmd
	_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		mark = p.Set(ctx, b.keys.Cancelled(runID), "1", b.markTTL)
		pub = p.Publish(ctx, b.keys.Cancel(runID), "superseded")
		return nil
	})
	var markErr error
	if err := mark.Err(); err != nil {
		markErr = fmt.Errorf("cancel mark: %w", err)
	}
	if err := pub.Err(); err != nil {
		return false, errors.Join(markErr, fmt.Errorf("publish: %w", err))
	}
	return true, markErr
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
	// From here a newer message, or the same one again (a regenerate, claimed past this
	// call), may take the session while this call sends its last bytes: stopped then, its
	// whole answer was cut, or ended with a superseded event after its own last one.
	s.cancels.answered(c.runID)
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
	var claim holds.SessionClaim
	var err error
	s.sessionArrivals.Store(c.runID, c.arrived)
	if c.sessionFrom.known {
		claim, err = s.store.ClaimSessionFrom(sctx, c.user.ID, sessionID, c.runID, message, c.sessionFrom.run)
		// Superseded by a run that claimed while this one waited: a newer message's, unless
		// it is one this process serves whose request arrived before this one's (an older
		// message that waited too, admitted first): this one, the newer, takes the session
		// from it as a claim of its own would. Read by from alone, the newer message was
		// answered 409 superseded and the older one ran.
		for range maxOlderClaims {
			if err != nil || !claim.Superseded || claim.Replaced != "" || !s.olderMessage(claim.Current, c.arrived) {
				break
			}
			claim, err = s.store.ClaimSessionFrom(sctx, c.user.ID, sessionID, c.runID, message, claim.Current)
		}
	} else {
		claim, err = s.store.ClaimSession(sctx, c.user.ID, sessionID, c.runID, message)
	}
	s.beforeStep(sctx, stepSessionClaimed)
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
	if claim.Superseded {
		// An attempt of the claim committed, its reply lost, and a newer message has taken the
		// session since: this is the older message. What that attempt replaced must stop all
		// the same, and this call must not run. Checked after the claim past an ended run too,
		// which is retried alike: a regenerate superseded so was forwarded beside the newer
		// message. So is a message whose admission waited for a settlement while a newer one
		// claimed the session (ClaimSessionFrom): it replaces nothing, and must not run.
		if claim.Replaced != "" {
			s.cancelReplaced(ctx, c, claim.Replaced)
		}
		c.outcome = outcomeRefused
		c.superseded = true
		if c.sessionFrom.known {
			return errSupersededAnswer, fmt.Errorf("session claim: superseded by run %s, a newer message's, while its admission waited", claim.Current)
		}
		return errSupersededAnswer, fmt.Errorf("session claim: superseded by run %s since its committed attempt", claim.Current)
	}
	if claim.Duplicate {
		c.outcome = outcomeDuplicate
		return errAlreadyRunning(claim.Current), nil
	}
	c.sessionClaimed = true
	s.cancels.claimed(c.runID, holds.SessionRef{UserID: c.user.ID, SessionID: sessionID})
	if claim.Replaced != "" {
		s.cancelReplaced(ctx, c, claim.Replaced)
	}
	return nil, nil
}

// maxOlderClaims bounds how often one claim is made again over an older message's run
// (claimSession): one per older message of its session admitted while it waited.
const maxOlderClaims = 4

// olderMessage reports whether run is a session call this process serves whose request
// arrived before arrived.
func (s *Server) olderMessage(run string, arrived time.Time) bool {
	v, ok := s.sessionArrivals.Load(run)
	return ok && v.(time.Time).Before(arrived)
}

// cancelReplaced tells the run a committed claim of c's replaced to stop. The claim is
// committed: the replaced run must stop whether or not this request's caller is still there
// to run the new one.
//
// A replaced run this process serves is stopped here, at once: the pub/sub round trip is for
// the other processes, and a cancel this process could not send through Redis let its own
// replaced run go on to its end, charged in full beside the newer message.
func (s *Server) cancelReplaced(ctx context.Context, c *call, replaced string) {
	here := s.cancels.deliver(replaced)
	sent, err := s.cancels.publish(context.WithoutCancel(ctx), replaced)
	switch {
	case err != nil && !sent && here:
		c.log.Warn("cancel of the replaced run not sent; it was stopped here, its own process", zap.String("replaced", replaced), zap.Error(err))
	case err != nil && !sent:
		c.log.Warn("cancel of the replaced run not sent; it runs to its end and is charged", zap.String("replaced", replaced), zap.Error(err))
	case err != nil:
		c.log.Warn("cancel of the replaced run sent without its mark; a process not subscribed right now never hears it",
			zap.String("replaced", replaced), zap.Error(err))
	}
}

// cancelReplacedLate cancels what c's claim replaced, for a claim that failed after one of its
// attempts committed: its run was superseded while the claim retried (only a committed claim
// is ever replaced), so the attempt's reply was lost and nothing told c what it replaced. The
// store has it recorded with the run (SessionClaimOf), read once the database answers again
// (the loss that failed the claim may last), in the background within settle_timeout, counted
// as a settlement so that the drain waits for it. Left undone, the run it replaced ran to its
// end, charged in full beside the newer messages.
func (s *Server) cancelReplacedLate(ctx context.Context, c *call) {
	ctx = context.WithoutCancel(ctx)
	s.settlements.start()
	s.inBackground(func() {
		defer s.settlements.leave()
		rctx, cancel := context.WithTimeout(ctx, s.cfg.Limits.SettleTimeout)
		claimed, replaced, err := s.store.SessionClaimOf(rctx, c.runID)
		cancel()
		switch {
		case err != nil:
			c.log.Warn("what the superseded claim replaced not read; that run, if any, runs to its end and is charged", zap.Error(err))
		case claimed && replaced != "":
			s.cancelReplaced(ctx, c, replaced)
		}
	})
}

// sessionClaimFailed refuses a call whose session claim failed (the caller logs the refusal,
// with the error returned): billing is down, unless the caller left while it waited (the
// failure is then its cancelled context). The admission budget running out is billing down.
//
// A claim that failed on a context a newer message of the session cancelled is superseded, not
// a caller that left: an attempt of it committed (its reply lost) and the newer message then
// replaced it while it backed off before its retry. Answered 499 without X-Should-Retry:
// false, an SDK sent it again, and the old message replaced the newer one. What that attempt
// replaced is cancelled too (cancelReplacedLate), as it is after any failed claim whose
// COMMIT went unanswered (holds.ErrClaimOutcomeUnknown): billing down, or the caller gone.
func (s *Server) sessionClaimFailed(ctx context.Context, c *call, err error) (*apiError, error) {
	c.outcome = outcomeRefused
	if errors.Is(context.Cause(ctx), errSuperseded) {
		c.superseded = true
		s.cancelReplacedLate(ctx, c)
		return errSupersededAnswer, fmt.Errorf("superseded during the session claim: %w", err)
	}
	if errors.Is(err, holds.ErrClaimOutcomeUnknown) {
		// An attempt may have committed and replaced a live run: the caller is refused all the
		// same, and that run must stop as a committed claim's would.
		s.cancelReplacedLate(ctx, c)
		// It may also have made c the session's current run, live until its release at 0
		// lands, yet never to answer: marked ended before the refusal goes out, as a call
		// refused after a claim that told it so is, the same message sent again (the retry a
		// 503 invites) runs. Unmarked, it was refused 409 already_running, not to be retried,
		// naming this run.
		c.sessionClaimed = true
		s.endSessionCall(ctx, c)
	}
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
