// Package proxy is tollgate's HTTP side: the OpenAI-compatible routes, auth, request
// rewriting, forwarding with a streaming tee into the meter, and the deferred settlement that
// runs whatever happens to the client.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// Deps is what the server is built from; cmd wires it.
type Deps struct {
	Config *config.Config
	Store  *holds.Store
	Redis  redis.UniversalClient
	Keys   runstate.Keys
	Tally  *runstate.Tally
	Leases *runstate.Leases
	Log    *zap.Logger
	// Metrics registers and exposes counters; nil builds a private registry.
	Metrics *Metrics
	// Transport reaches the upstreams; nil builds one tuned for many long streams.
	Transport http.RoundTripper
	// Admin, when set, is mounted at /admin; it authenticates with its own token.
	Admin http.Handler
	// DedupRedis holds duplicate detection (fingerprints, idempotency records, the session
	// cancel bus); nil uses Redis. Separate so a test can take it away on its own.
	DedupRedis redis.UniversalClient
	// Instance, when set, is this process's row in the database (holds.Instance): every hold
	// it admits carries its id, so that the reconciler settles them soon after a kill.
	Instance *holds.Instance
	// SessionCheckInterval is how often the session check runs (checkSessions): 0 for
	// holds.heartbeat_interval, negative for never (a test that runs the check itself).
	SessionCheckInterval time.Duration
}

// Server serves the gateway's HTTP surface.
type Server struct {
	cfg         *config.Config
	store       *holds.Store
	writer      *holds.Writer // groups admissions and settlements into batch transactions
	rdb         redis.UniversalClient
	keys        runstate.Keys
	tally       *runstate.Tally
	budgets     *runstate.RunBudget // shares a named run's cap among its calls in flight
	leases      *runstate.Leases
	log         *zap.Logger
	metrics     *Metrics
	prices      *pricing.Table
	snapshots   map[string][]byte // price snapshot JSON per configured model
	admin       http.Handler
	client      *http.Client
	auth        *keyCache
	creditMicro int64
	dedupRDB    redis.UniversalClient
	cancels     *cancelBus
	counting    *inFlightCounts // token counts in flight per caller (countTokens)
	bodies      *bodyMemory     // request bodies held in memory, per process and per caller
	answers     *answerMemory   // whole answers held in memory, per process
	readiness   readiness       // the last answer of /readyz (ready)

	// shuttingDown marks calls cut at the graceful-shutdown deadline, so they settle with
	// source "shutdown" rather than as a client's cancel.
	shuttingDown atomic.Bool
	// cut ends with errDrainDeadline when CutCalls cuts the calls still running: every call's
	// request context ends with it (cuttable).
	cut    context.Context
	cutAll context.CancelCauseFunc
	// calls and settlements track handlers and deferred settlements so shutdown can wait for
	// both (Drain); settleSlots bounds how many settlements run in the background at once (past
	// it a handler settles inline, which slows that caller instead of growing memory without
	// bound).
	calls       inFlight
	settlements inFlight
	settleSlots chan struct{}
	// settling counts the calls settling, by user, that an admission refused for want of a
	// slot or of credits waits for (admitWaitingForSettlements).
	settling settlingUsers
	// sessionArrivals: when the request of each session call this process serves arrived,
	// by run id, from its claim until its handler returns: a message whose admission waited
	// tells by it an older message's run from a newer one's (claimSession).
	sessionArrivals sync.Map
	// stopBeat ends the heartbeat of this process's run budget reservations and its session
	// check (checkSessions); beatDone closes when both have.
	stopBeat context.CancelFunc
	beatDone chan struct{}
	// stepObserver, when set (tests: ObserveSteps), is told of each store step before
	// forwarding as it starts, with the context it runs under (beforeStep).
	stepObserver atomic.Pointer[func(context.Context, string)]
}

// maxBackgroundSettlements bounds settlements in flight beyond their requests.
const maxBackgroundSettlements = 4096

// batchWorkers is how many key lookup batches run at once, writeWorkers how many batch
// transactions of admissions and settlements, and settleLinger how long settlements wait for
// an admission to share their commit (see holds.Writer).
const (
	batchWorkers = 2
	writeWorkers = 4
	settleLinger = 2 * time.Millisecond
)

// New builds a server. It panics on a configuration that Validate would have refused.
func New(d Deps) *Server {
	prices, err := d.Config.PriceTable()
	if err != nil {
		panic("proxy: " + err.Error())
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics(nil)
	}
	if d.Transport == nil {
		d.Transport = newTransport(d.Config.Limits)
	}
	if d.DedupRedis == nil {
		d.DedupRedis = d.Redis
	}
	bodyTotal, bodyPerCaller := d.Config.Limits.BodyMemoryBounds()
	s := &Server{
		cfg: d.Config, store: d.Store, rdb: d.Redis, keys: d.Keys, tally: d.Tally, leases: d.Leases,
		log: d.Log, metrics: d.Metrics, prices: prices, snapshots: priceSnapshots(prices), admin: d.Admin,
		client:      &http.Client{Transport: gunzipping{d.Transport}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		auth:        newKeyCache(d.Store, d.Config.Limits.KeyCacheTTL),
		creditMicro: d.Config.CreditMicro,
		settleSlots: make(chan struct{}, maxBackgroundSettlements),
		writer: holds.NewWriter(d.Store, holds.WriterConfig{Workers: writeWorkers, Linger: settleLinger,
			AdmitTimeout: d.Config.Limits.AdmitTimeout, SettleTimeout: d.Config.Limits.SettleTimeout,
			OnBatch: d.Metrics.observeBatch, ServedBy: servedBy(d.Instance)}),
		budgets: runstate.NewRunBudget(d.Redis, d.Keys, d.Config.Holds.TallyTTL, maxCall(d.Config.Limits),
			d.Config.Holds.LeaseTTL),
		dedupRDB: d.DedupRedis,
		cancels:  newCancelBus(d.DedupRedis, d.Keys, d.Config.Holds.HoldTTL, d.Log),
		counting: newInFlightCounts(maxCountsInFlight),
		bodies:   newBodyMemory(bodyTotal, bodyPerCaller, d.Metrics.RequestBodyBytes),
		answers:  newAnswerMemory(d.Config.Limits.ResponseMemoryBound(), d.Config.Limits.ResponseMemoryPerCaller(), d.Metrics.ResponseBodyBytes, d.Metrics.ResponseMemoryWaits),
		beatDone: make(chan struct{}),
	}
	s.cut, s.cutAll = context.WithCancelCause(context.Background())
	// Reservations beat as leases do: a killed process's go stale after the lease TTL.
	beat, stop := context.WithCancel(context.Background())
	s.stopBeat = stop
	var beating sync.WaitGroup
	beating.Go(func() { s.budgets.Run(beat, d.Config.Holds.HeartbeatInterval, d.Log) })
	if every := cmp.Or(d.SessionCheckInterval, d.Config.Holds.HeartbeatInterval); every > 0 {
		beating.Go(func() { s.checkSessions(beat, every) })
	}
	go func() {
		beating.Wait()
		close(s.beatDone)
	}()
	return s
}

// checkSessions stops, every interval (the heartbeat's), the session runs this process serves
// that a newer message replaced without its cancel arriving (cancelBus.checkReplaced), until
// ctx ends. A check bounded as a store step; one that fails is logged and the next one tries.
func (s *Server) checkSessions(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := s.storeContext(ctx)
		n, err := s.cancels.checkReplaced(cctx, s.store)
		s.metrics.SessionCheckStops.Add(float64(n))
		if err != nil && ctx.Err() == nil {
			s.log.Warn("session check failed; a run whose cancel was lost runs on until a check succeeds", zap.Error(err))
		}
		cancel()
	}
}

// maxCall is the longest a call can live: its upstream call, one more write to a slow client
// (each write is bounded by client_write_timeout), and a margin for its tally and settlement.
// A named run with no tally that is younger than that may still have a call running.
func maxCall(l config.Limits) time.Duration {
	return l.UpstreamTimeout + l.ClientWriteTimeout + time.Minute
}

func (s *Server) maxCall() time.Duration { return maxCall(s.cfg.Limits) }

// servedBy is what the writer stamps on new holds: the instance's id, or none.
func servedBy(in *holds.Instance) func() string {
	if in == nil {
		return nil
	}
	return in.ID
}

// upstreamPingAfter is how long an upstream connection over HTTP/2 may go without a frame from
// the upstream before the transport pings it, and upstreamPingTimeout how long that ping may go
// unanswered before the connection is dropped. Variables for tests (SetUpstreamPing).
var (
	upstreamPingAfter   = 15 * time.Second
	upstreamPingTimeout = 15 * time.Second
)

// newTransport is an upstream transport for many concurrent long-lived streams.
func newTransport(l config.Limits) *http.Transport {
	return &http.Transport{
		Proxy:                  nil, // the upstream is configured explicitly; never an ambient proxy
		DialContext:            (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           2048,
		MaxIdleConnsPerHost:    1024,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		MaxResponseHeaderBytes: maxUpstreamHeaderBytes,
		ExpectContinueTimeout:  time.Second,
		// HTTP/2 carries every call to an upstream on one connection, kept while it has no news
		// of it: one gone silent without closing (a NAT or load balancer that dropped it, a
		// failover) took each call sent on it until header_timeout or upstream_timeout, charged
		// its prompt's estimate though the provider never had it, for as long as TCP took to
		// give up on it (minutes). A connection silent for upstreamPingAfter is pinged and
		// dropped when the ping goes unanswered, its calls answered 502 upstream_unreachable
		// (charged nothing); the next ones go on a new connection. A provider still working on
		// a long answer acks the ping and is left alone. WriteByteTimeout drops one that takes
		// no more bytes for as long.
		HTTP2: &http.HTTP2Config{
			SendPingTimeout:  upstreamPingAfter,
			PingTimeout:      upstreamPingTimeout,
			WriteByteTimeout: upstreamPingAfter + upstreamPingTimeout,
		},
	}
}

// Handler is the gateway's router.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	// GetHead: a HEAD is answered as the GET it probes (load balancers' health checks send HEAD).
	r.Use(s.recoverPanics, s.metrics.countErrors, s.boundAnswerEnd, s.boundUnreadBody, shapeErrors, middleware.GetHead)
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) { writeError(w, errNotFound) })
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		// chi hands a custom 405 handler no list of the route's methods: they are found again.
		// chi also answers here, before it looks at the path, any method outside its own list
		// (PROPFIND, FOO, the HTTP/2 preface's PRI): a path that no method is served on is 404.
		allowed := allowedMethods(r, req)
		if len(allowed) == 0 {
			writeError(w, errNotFound)
			return
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
			Code: "method_not_allowed", Message: "Method not allowed on this route."})
	})
	// Model calls bound their writes themselves (writeBound); every other answer is bounded here.
	replies := r.With(s.boundReplies)
	replies.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	replies.Get("/readyz", s.ready)
	// GET only, as the other routes take their one method: any other method is a 405 that names
	// GET, not the metrics (Handle served every method).
	replies.Method(http.MethodGet, "/metrics", s.metrics.Handler())
	if s.admin != nil {
		replies.Mount("/admin", s.admin)
	}
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate)
		for _, rt := range routes {
			r.Post(rt.path, s.serveCall(rt))
		}
		replies := r.With(s.boundReplies)
		replies.Post(countTokensPath, s.countTokens)
		replies.Get(modelsPath, s.listModels)
		replies.Get(modelsPath+"/*", s.retrieveModel)
		replies.Get("/v1/credits", s.credits)
		replies.Get("/v1/runs/{id}", s.getRun)
		replies.Post("/v1/runs/{id}/settle", s.settleRun)
	})
	return r
}

// allowedMethods lists the methods r serves on req's path (httpapi.AllowedMethods), here or
// under /admin, on the path as chi routes it (escaped, as it came: agent%2F1 is one run name,
// not two segments).
func allowedMethods(r *chi.Mux, req *http.Request) []string {
	path := req.URL.RawPath
	if path == "" {
		path = req.URL.Path
	}
	return httpapi.AllowedMethods(func(m string) bool { return r.Match(chi.NewRouteContext(), m, path) })
}

// recoverPanics logs a panic that no handler recovered as any quote of an upstream is logged:
// its value may wrap what an upstream answered (a token count's answer, which is not a call's
// and has no finish to recover it), and with it the operator's key, of any length, which
// net/http's own line would print whole. Every configured upstream's key is replaced in it and
// it is bounded (loggedPanicOf); net/http, handed http.ErrAbortHandler, closes the connection
// as it would have and logs nothing more. A call's panic reaches here as
// http.ErrAbortHandler, logged and settled by finish, and passes on as it is.
func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p != http.ErrAbortHandler {
				// The line's stack is the panic's own: recover's return has not unwound it yet.
				s.log.Error("panic while serving", zap.String("panic", loggedPanicOf(s.cfg.Upstreams, p)),
					zap.String("method", r.Method), zap.String("path", r.URL.Path))
			}
			panic(http.ErrAbortHandler)
		}()
		next.ServeHTTP(w, r)
	})
}

// boundAnswerEnd bounds what net/http writes once a handler has returned — the end of a
// chunked answer, a small answer kept whole in the connection's buffer until then — by
// client_write_timeout: a client that stopped reading just as its socket buffer filled (or
// that pipelines requests and reads no answers) would otherwise hold the connection and its
// goroutine on that write for good. The server sets no write timeout, since a stream may
// rightly last minutes (writeBound moves the deadline while one is written), so the deadline
// left on the connection is lifted when its next request begins.
func (s *Server) boundAnswerEnd(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		next.ServeHTTP(w, r)
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.Limits.ClientWriteTimeout))
	})
}

// boundUnreadBody bounds the server's drain of a body its handler did not read to the end (a
// request refused before its body was read: a wrong key, an unknown route). The server reads
// what is left (up to 256 KiB) before it answers, with no deadline of its own: a caller that
// stalls inside that body, with or without a valid key, would hold the connection and its
// goroutine for good. The drain gets client_write_timeout, as a stalled body does in readBody.
func (s *Server) boundUnreadBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || s.cfg.Limits.ClientWriteTimeout <= 0 {
			next.ServeHTTP(w, r)
			return
		}
		b := &eofBody{ReadCloser: r.Body}
		r.Body = b
		next.ServeHTTP(w, r)
		if !b.eof {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.Limits.ClientWriteTimeout))
		}
	})
}

// eofBody records whether its body was read to the end.
type eofBody struct {
	io.ReadCloser
	eof bool
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// boundReplies gives each write of an answer that is not a model call's client_write_timeout
// (writeBound): the admin API's usage report runs to 30 MB, and a client that stopped reading
// once its socket buffer was full held the handler, its goroutine and the report for as long as
// it kept the connection. A client that keeps reading is not cut, however long it takes.
func (s *Server) boundReplies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&boundReplyWriter{ResponseWriter: w, bound: s.boundWrites(http.NewResponseController(w))}, r)
	})
}

// boundReplyWriter writes through a writeBound. Unwrap lets http.ResponseController reach the
// connection's writer.
type boundReplyWriter struct {
	http.ResponseWriter
	bound *writeBound
}

func (w *boundReplyWriter) Write(p []byte) (int, error) { return w.bound.write(w.ResponseWriter, p) }

func (w *boundReplyWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ready answers /readyz, which needs no key: it says which dependency is down, and the log
// says why (a driver's error names the database user and internal addresses).
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	code, status := s.readiness.answer(func() (int, map[string]string) { return s.checkReady(r.Context()) })
	httpapi.WriteJSON(w, code, status)
}

// readyCheckTimeout bounds each of /readyz's checks: a load balancer's probe (typically 5 s) must get
// an answer, and a store slower than this is not ready to serve calls either.
const readyCheckTimeout = 2 * time.Second

// checkReady writes to MySQL and to Redis, at once and each within readyCheckTimeout: checked
// one after the other under one deadline, a database that stalled spent it all, and Redis,
// checked with the deadline past, was named unavailable too. Writes, not PINGs: a store that
// answers PING but refuses writes (a read-only MariaDB, a Redis full under noeviction) refuses
// every call.
func (s *Server) checkReady(ctx context.Context) (int, map[string]string) {
	// Not the asking caller's context: others may be waiting for this check's answer.
	ctx = context.WithoutCancel(ctx)
	start := func(check func(context.Context) error) <-chan error {
		done := make(chan error, 1)
		go func() {
			pctx, cancel := context.WithTimeout(ctx, readyCheckTimeout)
			defer cancel()
			done <- check(pctx)
		}()
		return done
	}
	mysqlErr := start(s.store.CheckWritable)
	// The calls' writes to Redis are their duplicate checks, reservations and tallies.
	redisErr := start(func(ctx context.Context) error { return s.rdb.Set(ctx, s.keys.Prefix+"readyz", "1", time.Minute).Err() })
	status := map[string]string{"mysql": "ok", "redis": "ok"}
	code := http.StatusOK
	if err := <-mysqlErr; err != nil {
		s.log.Warn("readiness: mysql unreachable", zap.Error(err))
		status["mysql"], code = "unavailable", http.StatusServiceUnavailable
	}
	if err := <-redisErr; err != nil {
		s.log.Warn("readiness: redis unreachable", zap.Error(err))
		status["redis"], code = "unavailable", http.StatusServiceUnavailable
	}
	return code, status
}

// readyFor is how long a readiness check's answer stands. /readyz answers anyone without a
// key, and each check took a connection of the money paths' pool and, with a dependency down,
// logged a warning: a flood of it could starve admissions and write the log at its own pace.
const readyFor = time.Second

// readiness runs at most one check per readyFor; the callers that ask meanwhile get its answer.
type readiness struct {
	mu     sync.Mutex // held during a check: callers who come meanwhile wait for its answer
	at     time.Time  // when the last check ended
	code   int
	status map[string]string // never changed once stored
}

func (r *readiness) answer(check func() (int, map[string]string)) (int, map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.status == nil || time.Since(r.at) >= readyFor {
		r.code, r.status = check()
		r.at = time.Now()
	}
	return r.code, r.status
}

// Drain refuses calls from now on (503 shutting_down, before anything is held; a run's settle
// on request alike) and waits until every call and settle let in before has ended and every
// settlement started so far has finished,
// or ctx ends. Graceful shutdown calls it once the listener has stopped: a connection that had
// read its request before the listener's close may still bring a call after that.
func (s *Server) Drain(ctx context.Context) error {
	s.calls.close()
	// Calls first: a call still unwinding has yet to start its settlement, and none starts
	// one after it has left.
	if err := s.calls.wait(ctx); err != nil {
		return fmt.Errorf("calls in flight: %w", err)
	}
	if err := s.settlements.wait(ctx); err != nil {
		return fmt.Errorf("settlements in flight: %w", err)
	}
	return nil
}

// CutCalls cuts the calls still running when the drain deadline passes: each ends as one
// whose caller left — it settles by what it used, recorded as source "shutdown" — and tells
// its caller, who is still there, 503 shutting_down (in an error event once its stream has
// begun). Give their handlers a moment to write that before closing the connections.
func (s *Server) CutCalls() {
	s.shuttingDown.Store(true)
	s.cutAll(errDrainDeadline)
}

// errDrainDeadline is why a call's request context ended when CutCalls cut it.
var errDrainDeadline = errors.New("cut at the drain deadline of a graceful shutdown")

// errCountCut is why a token count's request context ended when CutCalls cut it: the drain
// deadline, for a request that is charged nothing, answered so (ended).
var errCountCut = fmt.Errorf("token count %w", errDrainDeadline)

// cuttable gives r a context that CutCalls ends; the returned func releases it.
func (s *Server) cuttable(r *http.Request) (*http.Request, func()) {
	return s.cuttableAs(r, nil)
}

// cuttableAs is cuttable, its context ended with cause (nil: the cut's own) when CutCalls cuts it.
func (s *Server) cuttableAs(r *http.Request, cause error) (*http.Request, func()) {
	ctx, cancel := context.WithCancelCause(r.Context())
	stop := context.AfterFunc(s.cut, func() {
		why := context.Cause(s.cut)
		if cause != nil {
			why = cause
		}
		cancel(why)
	})
	return r.WithContext(ctx), func() {
		stop()
		cancel(nil)
	}
}

// Close stops the server's background work: the beat of run budget reservations, the key
// lookup and the batch writer (after committing what is queued) and the session cancel bus.
// Call it after Drain at shutdown.
func (s *Server) Close() error {
	s.stopBeat()
	<-s.beatDone
	s.writer.Close()
	s.auth.lookups.Close()
	return s.cancels.close()
}

// storeContext bounds a database call made on a request's behalf by admit_timeout. A
// request's own context has no deadline, and the store retries an unreachable database until
// its context ends: without a bound the caller would wait out the outage instead of getting
// 503 billing_unavailable. Before forwarding, ctx is the call's admission budget
// (admissionContext), which ends first: a step gets what is left of it.
func (s *Server) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.Limits.AdmitTimeout)
}

// The steps beforeStep names: the store and Redis steps of a call's path (before forwarding,
// but for a named run's close and a call's settlement), and the moments a test holds a call at.
const (
	stepAdmit         = "admit"
	stepAttemptPinned = "attempt pinned"
	stepFingerprint   = "fingerprint run live"
	stepSessionClaim  = "session claim"
	stepReserve       = "run budget reservation"
	stepRunClose      = "run close"
	// stepSessionClaimed follows a session claim's answer (under the claim's context, as
	// stepSessionClaim), before the run it replaced is told to stop: a claim that lands while
	// another one of its session retries is held there.
	stepSessionClaimed = "session claimed"
	// stepAttemptAdmitted follows an Idempotency-Key attempt's committed admission: a
	// process that dies there leaves a hold and whatever was written before it.
	stepAttemptAdmitted = "attempt admitted"
	// stepAnswerFinal follows answerFinal: the call's answer is whole, its last bytes not yet
	// sent.
	stepAnswerFinal = "answer final"
	// stepFinalEvent precedes answerFinal at a stream's final event: the answer is whole and
	// metered, nothing of its end given back yet; a caller that leaves there has it whole.
	stepFinalEvent = "final event"
	// stepAdmitWaits: an admission refused for want of a slot or of credits waits for one of
	// its user's settlements (admitWaitingForSettlements); stepSettle precedes a call's
	// settlement.
	stepAdmitWaits = "admission waits for a settlement"
	stepSettle     = "settle"
	// stepRunCallEnd precedes the end of a named run's call (finishRunCall), once its answer's
	// end has gone out: a settle of the run sent then meets a call whose lease was given back
	// before its answer ended (tallyBeforeAnswer).
	stepRunCallEnd = "run call end"
	// stepRefund precedes the refund of what a call did not use of the hold another process
	// charged (refundPausedCharge), under its settlement's context, and the read for it of a
	// refused hold whose release gave up (releaseRefused).
	stepRefund = "refund"
	// stepRefusedMark precedes the mark that an admission was refused (markRefused), the
	// release at 0 of its hold to follow: a process stopped there past its hold's life leaves
	// it to a peer's reconciler, unleased, untallied and unmarked.
	stepRefusedMark = "refused mark"
	// stepIdemRecord precedes each read of an Idempotency-Key's record on a call's admission
	// (readIdem), under the admission's context: a test makes the call's caller leave while the
	// read is under way.
	stepIdemRecord = "idempotency record read"
	// stepHoldGranted opens runCall, under the call's admission budget: its hold is granted,
	// and nothing after the grant has run yet, not even the check at the grant (refuseLate). A
	// test holds a call there, as a process stopped right after its hold's COMMIT would be, to
	// let its admission budget run out, to have another process's reconciler charge its hold,
	// or to have a newer message of its session arrive first: a plain call, a session's
	// message before its claim and a named run's call have no other step there.
	stepHoldGranted = "hold granted"
)

// beforeStep tells the step observer, if any (tests), that step starts under ctx.
func (s *Server) beforeStep(ctx context.Context, step string) {
	if f := s.stepObserver.Load(); f != nil {
		(*f)(ctx, step)
	}
}

// redisStepTimeout bounds one Redis step on a caller's path: the duplicate checks (a
// fingerprint, an Idempotency-Key's record, a session's done mark), a named run's reservation
// and its close for settlement, a tally read for /v1/runs. Past it the caller gets its 503
// (dedup_unavailable, billing_unavailable) and its hold is released. Without it such a step
// ended only at the Redis client's read timeout — 3 s a try by default, never with
// read_timeout=-1 in REDIS_URL — while the caller held a hold and a max_in_flight slot. As
// long as a tally write's bound: the same Redis, the same round trips.
const redisStepTimeout = 2 * time.Second

// redisStep bounds one Redis step of a caller's request by redisStepTimeout (before
// forwarding, within what is left of its admission budget, admissionContext).
func redisStep(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, redisStepTimeout)
}

// priceSnapshots records, per configured model, the prices a run is billed at, so the bill can
// be explained after the price table changes. Built once: the table is fixed for a process.
func priceSnapshots(prices *pricing.Table) map[string][]byte {
	out := map[string][]byte{}
	for _, name := range prices.Models() {
		p, _, _ := prices.Lookup(name)
		out[name] = p.Snapshot(name)
	}
	return out
}
