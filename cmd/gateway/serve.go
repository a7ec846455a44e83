package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// serve runs the gateway until SIGTERM, SIGINT or SIGHUP (shutdownSignals: those it was not
// started ignoring) ends ctx, then drains: stop accepting,
// let calls in flight finish up to shutdown_timeout, wait for their settlements, exit. Before
// the drain it hands the signals to dieOnNextSignal, so that a second signal kills the process
// as an unhandled one does: an operator pressing Ctrl-C again wants it gone now, and what it
// leaves the reconciler settles, as after kill -9.
//
// SIGPIPE is ignored: a log read through a pipe (`make run | tee`, a log shipper) whose reader
// went away made the next log line kill the process on the spot, mid-call. A write to the
// broken pipe fails instead, and the gateway serves on without its log.
func serve(ctx context.Context, releaseSignals func(), args []string) error {
	signal.Ignore(syscall.SIGPIPE)
	var pprofAddr string
	var migrateFirst, changeCreditMicro, changeRedisPrefix bool
	e, err := setup(ctx, "serve", args, true, func(fs *flag.FlagSet) {
		fs.StringVar(&pprofAddr, "pprof", "", "serve net/http/pprof on this loopback address (off when empty); for profiling")
		fs.BoolVar(&migrateFirst, "migrate", false, "apply missing migrations before serving, as `gateway migrate` does (for a single gateway; a fleet migrates once, first)")
		fs.BoolVar(&changeCreditMicro, "change-credit-micro", false, "serve at this config's credit_micro though the database records another, "+
			"and record it as the fleet's (a deliberate change of what a credit is worth; stop the gateways serving the old value first)")
		fs.BoolVar(&changeRedisPrefix, "change-redis-prefix", false, "serve under this config's redis_key_prefix though the database records another, "+
			"and record it as the fleet's (a deliberate move of the fleet's Redis keys; stop the gateways under the old prefix first)")
	})
	if err != nil {
		return err
	}
	defer e.Close()
	if pprofAddr != "" {
		if err := servePprof(pprofAddr, e.log); err != nil {
			return err
		}
	}
	if err := readySchema(ctx, e, migrateFirst); err != nil {
		return err
	}
	store := e.store()
	if err := recordCreditUnit(ctx, store, e.cfg, changeCreditMicro, e.log); err != nil {
		return err
	}
	if err := recordRedisPrefix(ctx, store, e.cfg, changeRedisPrefix, e.log); err != nil {
		return err
	}
	if err := recordPlanTerms(ctx, store, e.cfg, e.log); err != nil {
		return err
	}
	if err := recordTTLs(ctx, store, e.cfg, e.log); err != nil {
		return err
	}
	warnUsersOnUnconfiguredPlans(ctx, store, e.cfg, e.log)
	// Listening before registering: a start that fails here (the port taken, say) leaves no
	// row for the other processes to find dead and count.
	ln, err := net.Listen("tcp", e.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", e.cfg.ListenAddr, err)
	}
	defer ln.Close() // Serve closes it too; this covers a return before Serve
	self, err := registerInstance(ctx, store, e.cfg, e.log)
	if err != nil {
		return err
	}
	g, err := e.newGateway(store, self)
	if err != nil {
		if self != nil {
			// It served nothing: retired, no other process takes it for dead.
			_ = self.Retire(context.WithoutCancel(ctx))
		}
		return err
	}
	bg := startBackground(ctx, self, g.leases, g.rec)
	defer bg.cancel()

	hs := newHTTPServer(g.srv.Handler(), e.log)
	for _, w := range e.cfg.Warnings() {
		e.log.Warn("configuration weakens a guarantee", zap.String("warning", w))
	}
	e.log.Info("gateway listening", zap.String("addr", ln.Addr().String()))
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	dieOnNextSignal(e.log, releaseSignals)
	stop := stopping{cfg: e.cfg, log: e.log, hs: hs, srv: g.srv, self: self, bg: bg}
	stop.run()
	return nil
}

// The listener's own bounds (README, HTTP surface). A request's headers must arrive within
// readHeaderTimeout (a client trickling them, slowloris, holds a connection and a goroutine
// while it does) and hold at most maxRequestHeaderBytes (431 past it); a keep-alive connection
// idle for idleTimeout is closed. There is no ReadTimeout or WriteTimeout: a stream rightly
// lasts minutes. The proxy bounds the rest itself: a body by client_write_timeout per stall and
// minBodyRate on average (proxy.readBody, boundUnreadBody), each write by client_write_timeout
// (writeBound, boundAnswerEnd).
const (
	readHeaderTimeout     = 10 * time.Second
	idleTimeout           = 120 * time.Second
	maxRequestHeaderBytes = 64 << 10
)

// newHTTPServer is the gateway's http.Server on handler, net/http's own lines in log. It serves
// HTTP/1.1 alone on a plain listener (no TLS, so no HTTP/2): TLS and HTTP/2 belong to a proxy in
// front of it.
func newHTTPServer(handler http.Handler, log *zap.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxRequestHeaderBytes,
		ErrorLog:          zap.NewStdLog(log),
	}
}

// readySchema refuses to serve on a schema behind the code (a hold written to a table
// missing a column fails every call), after applying what is missing when asked to.
func readySchema(ctx context.Context, e *env, migrateFirst bool) error {
	if migrateFirst {
		if err := migrateOnStart(ctx, e); err != nil {
			return err
		}
	}
	if err := schemaCurrent(ctx, e.db); err != nil {
		return err
	}
	warnUnboundedIdleTransactions(ctx, e.db, e.log)
	warnReadOnlyBypass(ctx, e.db, e.log)
	return nil
}

// recordCreditUnit records the credit_micro this gateway serves at as the fleet's
// (holds.CreditUnit), which the operator's commands then require of their config. A value
// other than the recorded one is refused unless change: a gateway started with a stale config
// beside the fleet would admit by plan allowances, and convert its admin API's credits, at
// another rate than the other gateways, and moving the record would make every operator
// command follow it. A deliberate change (change set) is recorded and logged; the gateways
// still serving the old value go on at it until they stop, which is why the flag's help says
// to stop them first.
func recordCreditUnit(ctx context.Context, store *holds.Store, cfg *config.Config, change bool, log *zap.Logger) error {
	prev, found, err := store.RecordCreditUnit(ctx, cfg.CreditMicro, cfg.Instance, change)
	var mismatch *holds.CreditUnitMismatchError
	if errors.As(err, &mismatch) {
		return fmt.Errorf("%w: a gateway serving at another value beside the fleet would convert plan allowances and the admin API's credits "+
			"at another rate; pass the fleet's config, or, to change what a credit is worth deliberately, stop the gateways serving at %d "+
			"and start this one with -change-credit-micro (once: the others then start with the new config as usual)",
			err, mismatch.Recorded.CreditMicro)
	}
	if err != nil {
		return err
	}
	switch {
	case !found:
		log.Info("credit_micro recorded as the fleet's", zap.Int64("credit_micro", cfg.CreditMicro))
	case prev.CreditMicro != cfg.CreditMicro:
		log.Warn("credit_micro changed: every amount in credits is converted at the new value from now on (balances, grants, plan allowances, reports); gateways still serving the old value convert at it until they stop",
			zap.Int64("credit_micro", cfg.CreditMicro), zap.Int64("previous_credit_micro", prev.CreditMicro),
			zap.String("previous_set_by", prev.SetBy), zap.Time("previous_set_at", prev.SetAt))
	}
	return nil
}

// recordRedisPrefix records the redis_key_prefix this gateway names its Redis keys under as the
// fleet's (holds.RedisPrefix), which `reconcile -once` then requires of its config. Another
// than the recorded one is refused unless change, as another credit_micro is: beside the
// fleet, this gateway's reconciler would find none of the others' leases and tallies, and
// charge their live and tallied calls their whole holds (and theirs this one's). A deliberate
// change (a fleet moved to another prefix, all stopped first) is recorded and logged.
func recordRedisPrefix(ctx context.Context, store *holds.Store, cfg *config.Config, change bool, log *zap.Logger) error {
	prev, found, err := store.RecordRedisPrefix(ctx, cfg.RedisKeyPrefix, cfg.Instance, change)
	var mismatch *holds.RedisPrefixMismatchError
	if errors.As(err, &mismatch) {
		return fmt.Errorf("%w: a gateway under another prefix beside the fleet would see none of the others' leases and tallies, and its "+
			"reconciler would charge their calls their whole holds; pass the fleet's config (or TOLLGATE_REDIS_PREFIX), or, to move the "+
			"fleet to another prefix deliberately, stop the gateways under %q and start this one with -change-redis-prefix (once: the "+
			"others then start with the new prefix as usual)", err, mismatch.Recorded.Prefix)
	}
	if err != nil {
		return err
	}
	switch {
	case !found:
		log.Info("redis_key_prefix recorded as the fleet's", zap.String("redis_key_prefix", cfg.RedisKeyPrefix))
	case prev.Prefix != cfg.RedisKeyPrefix:
		log.Warn("redis_key_prefix changed: reconcile -once requires the new prefix from now on; the tallies and leases under the previous one are not read by this gateway",
			zap.String("redis_key_prefix", cfg.RedisKeyPrefix), zap.String("previous_redis_key_prefix", prev.Prefix),
			zap.String("previous_set_by", prev.SetBy), zap.Time("previous_set_at", prev.SetAt))
	}
	return nil
}

// recordTTLs records this gateway's holds.tally_ttl and dedup.replay_ttl where they are longer
// than those recorded (holds.LongestTTL): how long the fleet's Redis may keep a run's tally, or
// an Idempotency-Key's record of it, which `gateway prune`'s cutoff must pass whatever its own
// config says.
func recordTTLs(ctx context.Context, store *holds.Store, cfg *config.Config, log *zap.Logger) error {
	tally, replay, err := store.RecordTTLs(ctx, cfg.Holds.TallyTTL, cfg.Dedup.ReplayTTL, cfg.Instance)
	if err != nil {
		return fmt.Errorf("record the Redis TTLs: %w", err)
	}
	if tally || replay {
		log.Info("the longest Redis TTLs recorded for gateway prune's cutoff",
			zap.Duration("tally_ttl", cfg.Holds.TallyTTL), zap.Bool("tally_ttl_raised", tally),
			zap.Duration("replay_ttl", cfg.Dedup.ReplayTTL), zap.Bool("replay_ttl_raised", replay))
	}
	return nil
}

// recordPlanTerms records the plan terms this gateway serves by as the fleet's
// (holds.PlanTerms), which the operator's commands that use them then require of their config.
// Unlike another credit_micro, other terms than those recorded are not refused: plans change
// routinely (a plan added, an allowance raised), by a config rolled out one gateway at a time,
// and this start is how. So the record is the last started gateway's. During a rolling change
// the commands follow the new config while the gateways not yet restarted hold and charge by
// the old; a gateway started with a stale config moves the record back under the others, and
// the warning, with each change and the terms before and after, is what shows it.
func recordPlanTerms(ctx context.Context, store *holds.Store, cfg *config.Config, log *zap.Logger) error {
	prev, found, err := store.RecordPlanTerms(ctx, cfg.Instance)
	if err != nil {
		return fmt.Errorf("record the plan terms: %w", err)
	}
	mine := store.PlanTerms()
	if !found {
		log.Info("plan terms recorded as the fleet's", zap.Any("plan_terms", mine))
		return nil
	}
	diffs := holds.DiffPlanTerms(prev.Terms, mine)
	if len(diffs) == 0 {
		return nil
	}
	changes := make([]string, len(diffs))
	for i, d := range diffs {
		changes[i] = d.String()
	}
	log.Warn("plan terms changed: the operator's commands that use plan terms now require this config's plans; gateways started with the previous ones hold and charge by them until they restart",
		zap.Strings("changes", changes), zap.Any("plan_terms", mine), zap.Any("previous_plan_terms", prev.Terms),
		zap.String("previous_set_by", prev.SetBy), zap.Time("previous_set_at", prev.SetAt))
	return nil
}

// registerInstance registers the process before it serves, so that every hold it admits
// names it; nil when find_dead_instances is off.
func registerInstance(ctx context.Context, store *holds.Store, cfg *config.Config, log *zap.Logger) (*holds.Instance, error) {
	if !cfg.Holds.FindDeadInstances {
		return nil, nil
	}
	self, err := store.RegisterInstance(ctx, cfg.Instance, cfg.Holds.HeartbeatInterval, cfg.Holds.DeadInstanceBound(), log)
	if err != nil {
		return nil, err
	}
	log.Info("instance registered", zap.String("instance_id", self.ID()))
	return self, nil
}

// gateway is what a serving process runs: the proxy, the lease beats of its calls and the
// reconciler, sharing one set of metrics so that /metrics shows them all.
type gateway struct {
	srv    *proxy.Server
	leases *runstate.Leases
	rec    *holds.Reconciler
}

func (e *env) newGateway(store *holds.Store, self *holds.Instance) (gateway, error) {
	cfg := e.cfg
	keys := redisKeys(cfg)
	leases := runstate.NewLeases(e.rdb, keys, cfg.Instance, cfg.Holds.LeaseTTL, cfg.Holds.HeartbeatInterval, e.log)
	metrics := proxy.NewMetrics(nil)
	store.OnSettled(metrics.ObserveSettled)
	if self != nil {
		self.OnTwins(func(n int) { metrics.InstanceTwins.Set(float64(n)) })
	}
	srv := proxy.New(proxy.Deps{
		Config: cfg, Store: store, Redis: e.rdb, Keys: keys,
		Tally:  runstate.NewTally(e.rdb, keys, cfg.Holds.TallyTTL),
		Leases: leases, Log: e.log, Metrics: metrics,
		Admin:    admin.New(store, cfg.CreditMicro, cfg.AdminToken, e.log.Named("admin")),
		Instance: self,
	})
	rec, err := e.newReconciler(reconcilerDeps{cfg: cfg, store: store, rdb: e.rdb, keys: keys, self: self, leases: leases,
		onOutcome: func(outcome string) {
			metrics.Reconciled.WithLabelValues(outcome).Inc()
			if outcome == holds.OutcomeChargedHeld {
				metrics.ReconcileHold.Inc()
			}
		},
		onDeadInstances: func(n int) { metrics.DeadInstances.Add(float64(n)) },
		onPass:          func(failed bool) { metrics.ReconcilePasses.WithLabelValues(passResult(failed)).Inc() }})
	if err != nil {
		return gateway{}, err
	}
	return gateway{srv: srv, leases: leases, rec: rec}, nil
}

// background is the work that outlives the signal: leases must keep beating while calls
// drain, and the reconciler may as well keep settling; both stop when serve returns. The
// instance beats apart, until Retire rather than until serve returns: a beat after Retire
// would find the row dead and register a new one that nothing retires.
type background struct {
	stopBeat context.CancelFunc
	beatDone <-chan struct{}
	stopRest context.CancelFunc
	running  *sync.WaitGroup // the lease beats and the reconciler
}

func startBackground(ctx context.Context, self *holds.Instance, leases *runstate.Leases, rec *holds.Reconciler) background {
	rest, stopRest := context.WithCancel(context.WithoutCancel(ctx))
	beat, stopBeat := context.WithCancel(rest)
	beatDone := make(chan struct{})
	go func() {
		defer close(beatDone)
		if self != nil {
			self.Run(beat)
		}
	}()
	running := &sync.WaitGroup{}
	running.Go(func() { leases.Run(rest) })
	running.Go(func() { rec.Run(rest) })
	return background{stopBeat: stopBeat, beatDone: beatDone, stopRest: stopRest, running: running}
}

// cancel ends all of it without waiting: serve's last word, whatever path it returns by.
func (b background) cancel() {
	b.stopBeat()
	b.stopRest()
}

// cutGrace is how long the calls cut at the drain deadline have to tell their callers so before
// their connections are closed: each writes one answer or event, unless its caller does not
// read. Inside the exit's bound after the drain (settle_timeout + 5 s).
const cutGrace = 2 * time.Second

// stopping is a serving process's shutdown, begun by a signal: drain, cut what the drain's
// deadline leaves, wait for the settlements and the batch writer, retire the instance row,
// and end the background work — each within the exit's bound.
type stopping struct {
	cfg  *config.Config
	log  *zap.Logger
	hs   *http.Server
	srv  *proxy.Server
	self *holds.Instance // nil when find_dead_instances is off
	bg   background
}

func (s *stopping) run() {
	s.log.Info("shutting down: draining calls in flight", zap.Duration("deadline", s.cfg.Limits.ShutdownTimeout))
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.Limits.ShutdownTimeout)
	defer cancel()
	err := s.hs.Shutdown(sctx)
	// The exit's bound past the drain, from its end: the cut calls' answers, every settlement,
	// the batch writer's last transactions and the row's retirement.
	wctx, wcancel := context.WithTimeout(context.Background(), s.cfg.Limits.SettleTimeout+5*time.Second)
	defer wcancel()
	if err != nil {
		// Calls still running at the deadline are cut: each tells its caller (503
		// shutting_down, or an error event in its stream) and its deferred settlement charges
		// what it used. The connections still open cutGrace later (a caller not reading) are
		// closed.
		s.log.Warn("drain deadline passed; cutting remaining calls", zap.Error(err))
		s.srv.CutCalls()
		gctx, gcancel := context.WithTimeout(wctx, cutGrace)
		if err := s.hs.Shutdown(gctx); err != nil {
			_ = s.hs.Close()
		}
		gcancel()
	}
	// Said so that an operator (and a test) can tell a process still settling from one stuck
	// serving: from here on only settlements keep it alive.
	s.log.Info("calls drained; waiting for their settlements", zap.Duration("deadline", s.cfg.Limits.SettleTimeout+5*time.Second))
	if err := s.srv.Drain(wctx); err != nil && !errors.Is(err, context.Canceled) {
		s.log.Error("settlements still pending at exit; the reconciler will settle them", zap.Error(err))
	}
	// Close waits for the batch writer's last transactions. A database that stopped answering
	// would hold it past any bound (a batch's COMMIT, once sent, is waited for; batches still
	// queued each get their own settle_timeout): the exit keeps the same bound as above, and
	// what is left unsettled the reconciler settles from the tally.
	closed := make(chan error, 1)
	go func() { closed <- s.srv.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			s.log.Warn("closing the cancel subscription", zap.Error(err))
		}
	case <-wctx.Done():
		s.log.Error("batch writer still busy at exit; the reconciler will settle what it held")
	}
	// Retired, the process's row tells the next reconcile pass to settle any hold it left
	// (a settlement that failed in the drain) now rather than at the hold's expiry.
	// Within the exit's bound, as the settlements: past it (the database frozen) the row is
	// found dead once its beat is stale instead.
	s.bg.stopBeat()
	<-s.bg.beatDone
	if s.self != nil {
		if err := s.self.Retire(wctx); err != nil {
			s.log.Warn("instance not retired; another process finds it dead once its heartbeat is stale", zap.Error(err))
		}
	}
	// The lease beats and the reconciler end before the deferred Close of their database and
	// Redis clients (a pass cut off by that close logged errors of a failure that was not
	// one), within the exit's bound as the rest: their work ends with their context, in a
	// round trip.
	s.bg.stopRest()
	if !waitWithin(wctx, s.bg.running) {
		s.log.Warn("background work still running at exit")
	}
	s.log.Info("gateway stopped")
}

// dieOnNextSignal stops the signals ending ctx (release) and has the next one kill the process
// as an unhandled signal does, after a line that says the drain was abandoned.
func dieOnNextSignal(log *zap.Logger, release func()) {
	next := make(chan os.Signal, 1)
	signal.Notify(next, shutdownSignals...)
	release()
	go func() {
		sig := <-next
		log.Error("second signal: drain abandoned, exiting now; the reconciler settles what this process leaves",
			zap.String("signal", sig.String()))
		_ = log.Sync()
		signal.Reset(shutdownSignals...)
		_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
	}()
}

// passResult is the result label of tollgate_reconcile_passes_total.
func passResult(failed bool) string {
	if failed {
		return "failed"
	}
	return "done"
}

// waitWithin waits for wg until ctx ends and reports whether it ended first.
func waitWithin(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// redisKeys names the Redis keys, under the configured prefix (redis_key_prefix or
// TOLLGATE_REDIS_PREFIX; the end-to-end tests run several gateways per Redis).
func redisKeys(cfg *config.Config) runstate.Keys { return runstate.Keys{Prefix: cfg.RedisKeyPrefix} }

// reconcileOnce is `gateway reconcile --once`: one pass of the reconciler, for an operator.
// It takes the lock like every process does (a live gateway holding it means this pass does
// nothing and says so); -force scans without the lock, which is safe because every
// settlement is conditional.
func reconcileOnce(ctx context.Context, args []string) error {
	var once, force bool
	e, err := setup(ctx, "reconcile", args, true, func(fs *flag.FlagSet) {
		fs.BoolVar(&once, "once", false, "run one pass and exit (required: the loop runs inside gateway serve)")
		fs.BoolVar(&force, "force", false, "scan even if another process holds the reconcile lock")
	})
	if err != nil {
		return err
	}
	defer e.Close()
	if !once {
		return errors.New("reconcile: pass -once (the periodic reconciler runs inside `gateway serve`)")
	}
	// The lock is re-entrant for its holder: under a serving gateway's name (its environment's
	// TOLLGATE_INSTANCE, where an operator execs into its container) this pass took that
	// gateway's lock as its own, scanned beside it and then deleted it under it.
	// Its log lines too: named as the gateway, its money lines said the gateway settled the
	// runs it settled.
	e.runAs(fmt.Sprintf("%s/reconcile-once:%d", e.cfg.Instance, os.Getpid()))
	rec, err := e.newReconciler(reconcilerDeps{cfg: e.cfg, store: e.store(), rdb: e.rdb, keys: redisKeys(e.cfg)})
	if err != nil {
		return err
	}
	pass := rec.RunOnce
	if force {
		pass = rec.RunForced
	}
	st, err := pass(ctx)
	if !st.Locked && err == nil {
		fmt.Println("reconcile: another process holds the lock; nothing scanned (use -force to scan anyway)")
		return nil
	}
	if st.Locked && !force {
		lock := redisLock{rdb: e.rdb, key: redisKeys(e.cfg).ReconcileLock(), instance: e.cfg.Instance}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := lock.Release(rctx); rerr != nil {
			// It lapses on its own within holds.reconcile_lock_ttl.
			e.log.Warn("reconcile lock not released", zap.Error(rerr))
		}
	}
	fmt.Println(passSummary(st, e.cfg.CreditMicro))
	if err == nil && st.Orphans > 0 {
		// Every pass will pass them over again: the exit status is what a cron job or a
		// runbook checks, so it says someone has to act.
		return fmt.Errorf("reconcile: %d holds of users that no longer exist are left unsettled: restore the users (the error log names each run_id and user_id)", st.Orphans)
	}
	return err
}

// passSummary is the line `reconcile -once` prints for a pass: its counts, what it charged in
// credits as every other figure the operator reads (balances, grants, reports), and, if it
// stopped early, at which bound (the batch limit or the time budget: which to look at if every
// pass stops there) and that the operator should run it again.
func passSummary(st holds.Stats, creditMicro int64) string {
	s := fmt.Sprintf("reconcile: scanned %d in %d batches: %d settled from tally, %d released, %d charged at hold, %d extended (leased), %d already settled, %d errors; charged %s credits",
		st.Scanned, st.Batches, st.FromTally, st.Released, st.ChargedHeld, st.Extended, st.AlreadySettled, st.Errors,
		pricing.FormatCredits(st.ChargedMicro, creditMicro))
	if st.Orphans > 0 {
		s += fmt.Sprintf("; %d passed over: holds of users that no longer exist", st.Orphans)
	}
	if st.BroughtIn > 0 {
		// Holds of processes found dead (or shut down) before this pass, settled before their
		// expiry: the counts above include them.
		s += fmt.Sprintf("; %d of them holds of dead gateway processes, brought in before their expiry", st.BroughtIn)
	}
	if st.Truncated {
		s += fmt.Sprintf(" (stopped at the %s; run again)", st.StoppedAt)
	}
	return s
}

// servePprof exposes the profiler on its own listener, loopback only: profiles show request
// data and must never share the public port.
func servePprof(addr string, log *zap.Logger) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-pprof %s: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("-pprof %s: only a loopback address is allowed", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("-pprof %s: %w", addr, err)
	}
	log.Info("pprof listening", zap.String("addr", ln.Addr().String()))
	ps := newPprofServer(log)
	go func() {
		if err := ps.Serve(ln); err != nil {
			log.Warn("pprof stopped serving", zap.Error(err))
		}
	}()
	return nil
}

// newPprofServer is the profiler's http.Server: the public listener's bounds (newHTTPServer,
// which sets no write timeout: a CPU profile or a trace is written after its whole ?seconds=
// window), and net/http's own lines in log as JSON, as the public listener's are. Without an
// ErrorLog they went to stderr as plain text, which a log pipeline reading JSON lines drops.
func newPprofServer(log *zap.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return newHTTPServer(mux, log)
}

// plansCheckTimeout bounds warnUsersOnUnconfiguredPlans's scan of users: a check, not a gate.
const plansCheckTimeout = 10 * time.Second

// warnUsersOnUnconfiguredPlans says so at start when users' rows name a plan the config does
// not have: they are served on default_plan's terms, which may give more than their plan did
// (a plans section that left out the demo's guest, whose users then got standard's 2000
// credits a day instead of 100), or less.
func warnUsersOnUnconfiguredPlans(ctx context.Context, st *holds.Store, cfg *config.Config, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, plansCheckTimeout)
	defer cancel()
	byPlan, err := st.UsersByPlan(ctx)
	if err != nil {
		log.Warn("could not check that every user's plan is configured", zap.Error(err))
		return
	}
	for _, plan := range slices.Sorted(maps.Keys(byPlan)) {
		if _, ok := cfg.Plans[plan]; !ok {
			log.Warn("users on a plan that is not configured get the default plan's terms; configure the plan or move them (gateway user set -plan)",
				zap.String("plan", plan), zap.Int64("users", byPlan[plan]), zap.String("default_plan", cfg.DefaultPlan))
		}
	}
}

// warnReadOnlyBypass says so at start when the gateway's database account holds a privilege
// with which read_only does not bind it (SUPER, READ_ONLY ADMIN): README's failover promise — a
// demoted primary refuses the gateway's writes — then does not hold, and a gateway still
// connected to the old primary after a failover goes on admitting and settling there, beside
// the promoted one. The tests' account has ALL PRIVILEGES, and nothing said so; `make run` now
// serves as an account with DML only, and says nothing.
func warnReadOnlyBypass(ctx context.Context, db *sqlx.DB, log *zap.Logger) {
	privs, err := holds.ReadOnlyBypass(ctx, db)
	switch {
	case err != nil:
		log.Warn("could not read the database account's privileges", zap.Error(err))
	case len(privs) > 0:
		log.Warn("database weakens a guarantee", zap.Strings("privileges", privs), zap.String("warning",
			"the gateway's database account holds "+strings.Join(privs, " and ")+", so read_only does not bind it: "+
				"a primary demoted by a failover, or set read_only for maintenance, takes its writes instead of refusing them, "+
				"and a gateway still connected to it admits and settles there beside the promoted server; give the gateway an account without them"))
	}
}

// warnUnboundedIdleTransactions says so at start when the database never ends a transaction
// whose client went silent (MySQL, or a DSN's idle_transaction_timeout=0): an operator running
// several gateways should know that one paused inside a transaction keeps its users' rows
// locked, and those users refused on the others, for the whole pause.
func warnUnboundedIdleTransactions(ctx context.Context, db *sqlx.DB, log *zap.Logger) {
	bound, err := holds.IdleTransactionBound(ctx, db)
	switch {
	case err != nil:
		log.Warn("could not read the database's bound on idle transactions", zap.Error(err))
	case bound == 0:
		log.Warn("database weakens a guarantee", zap.String("warning",
			"it never ends a transaction whose client went silent (no idle_transaction_timeout: MySQL, or set to 0 in the DSN): "+
				"a gateway paused or cut off inside a transaction keeps its users' rows locked, and those users refused 503 on every other gateway, "+
				"until wait_timeout (3 min) for a dead host and for the whole pause for a paused one"))
	}
}
