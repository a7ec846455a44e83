package proxy

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate/tollgate/holds"
)

// Metrics are the gateway's Prometheus series. The ones an operator must watch:
// settle_failures (runs left to the reconciler) and reconcile_hold (charged at the hold
// because their usage was lost).
type Metrics struct {
	reg      *prometheus.Registry
	Requests *prometheus.CounterVec
	// ErrorAnswers counts the error answers the gateway wrote itself (writeError, and the
	// admin API's), by status and code: what tollgate_requests_total's status alone cannot
	// tell apart (429 too_many_in_flight from too_many_request_bytes, 503 billing_unavailable
	// from server_busy). The code is one of errorCodes, else "other".
	ErrorAnswers   *prometheus.CounterVec
	Settlements    *prometheus.CounterVec
	SettleFailures prometheus.Counter
	TallyFailures  prometheus.Counter
	ReconcileHold  prometheus.Counter
	Reconciled     *prometheus.CounterVec
	// DeadInstances counts the processes this one's reconciler declared dead (their heartbeat
	// in the database stopped), whose holds it then brought in rather than wait for hold_ttl.
	// A process shut down gracefully retires its own row and is not counted.
	DeadInstances prometheus.Counter
	// SessionCheckStops counts the session runs this process's session check stopped: each
	// a cancel that never reached it (its sender killed, or Redis out of reach).
	SessionCheckStops prometheus.Counter
	// InstanceTwins is how many other live processes serve under this one's instance name
	// (holds.Instance.OnTwins, set by cmd/gateway): 0 as it must be.
	InstanceTwins prometheus.Gauge
	// ReconcilePasses counts the reconcile passes this process ran holding the lock, by result.
	ReconcilePasses *prometheus.CounterVec
	ActiveCalls     prometheus.Gauge
	// RequestBodyBytes is what the request bodies held now count against limits.max_body_memory.
	RequestBodyBytes prometheus.Gauge
	// ResponseBodyBytes is what the whole answers read now count against
	// limits.max_response_memory.
	ResponseBodyBytes prometheus.Gauge
	// ResponseMemoryWaits counts the times a whole answer waited for room in it.
	ResponseMemoryWaits prometheus.Counter
	Duplicates          *prometheus.CounterVec
	SettleSeconds       prometheus.Histogram
	BatchItems          *prometheus.HistogramVec
	// Charged and BilledTokens are what the settlements this process committed charged, by
	// source, and the tokens they billed, by kind: the day ledger's rate, for dashboards and
	// alerts. The ledger and `gateway report` are the record; these restart at 0 with the
	// process, and a process counts the settlements it committed, its reconciler's included.
	Charged *prometheus.CounterVec
	// Uncharged is the cost past the caps, which no one was charged (holds.Settled.UnchargedMicro).
	Uncharged    *prometheus.CounterVec
	BilledTokens *prometheus.CounterVec
	// CallPhase splits what a call waits for before its answer starts, so that time added by
	// the gateway can be told apart from time spent upstream.
	CallPhase *prometheus.HistogramVec
	// The phases' series, resolved once: a call observes auth, body, admit, checks, upstream
	// and (a stream) first_event, its admission's batch the two parts of admit.
	authPhase, bodyPhase, admitPhase, checksPhase, upstreamPhase, firstEventPhase prometheus.Observer
	admitQueuePhase, admitTxPhase                                                 prometheus.Observer
	// chargedBy and billed are Charged's series per settle source and BilledTokens' per kind,
	// resolved once: ObserveSettled runs on the batch writer's goroutine, once per settlement.
	chargedBy map[string]prometheus.Counter
	billed    [len(tokenKinds)]prometheus.Counter
}

// tokenKinds are BilledTokens' kinds, in the order ObserveSettled counts them.
var tokenKinds = [...]string{"input", "cache_read", "cache_write", "output", "cache_write_1h", "audio_input", "audio_output"}

// Phases of CallPhase, in the order a call goes through them.
const (
	phaseAuth     = "auth"     // the caller's key looked up (a cache hit, or a query); every authenticated route
	phaseBody     = "body"     // the request body read
	phaseAdmit    = "admit"    // arrival (body read, validated) to its hold committed
	phaseChecks   = "checks"   // hold to the upstream request sent: duplicate checks, run budget, rewrite
	phaseUpstream = "upstream" // upstream request sent to the upstream's response headers
	// A stream's response headers to its first event written and flushed to the caller.
	phaseFirstEvent = "first_event"
	// Parts of admit: the admission's wait in the batch writer's queue, and its batch
	// transaction (what the database takes, under the load of the moment).
	phaseAdmitQueue = "admit_queue"
	phaseAdmitTx    = "admit_tx"
)

// NewMetrics registers the series on reg (nil: a fresh registry with Go runtime metrics).
func NewMetrics(reg *prometheus.Registry) *Metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m := &Metrics{
		reg: reg,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_requests_total",
			Help: "Model requests by route and status code."}, []string{"route", "code"}),
		ErrorAnswers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_error_answers_total",
			Help: "Error answers the gateway wrote itself (refusals, its upstream_* failures before an answer began, the admin API's errors), by status and error code; " +
				"an upstream's error passed on as it sent it and an error event ending a stream under way are not counted."},
			[]string{"status", "code"}),
		Settlements: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_settlements_total",
			Help: "Settlements by source; applied=false means the run had been settled before."}, []string{"source", "applied"}),
		SettleFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_settle_failures_total",
			Help: "Settlements that gave up, or were still queued behind a stalled database at settle_timeout; the reconciler settles these runs from the tally if they never commit."}),
		TallyFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_tally_failures_total",
			Help: "Tally writes to Redis that failed; the call was still served and settled."}),
		ReconcileHold: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_reconcile_hold_total",
			Help: "Runs the reconciler charged at their hold because no usage survived. Someone should look."}),
		Reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_reconciled_total",
			Help: "Expired holds handled by the reconciler, by outcome."}, []string{"outcome"}),
		ReconcilePasses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_reconcile_passes_total",
			Help: "Reconcile passes this process ran holding the lock, by result (done, failed). Summed over the fleet it must keep rising: with no passes, expired holds stay unsettled."}, []string{"result"}),
		DeadInstances: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_dead_instances_total",
			Help: "Gateway processes this process's reconciler declared dead (heartbeat in the database stopped for holds.dead_instance_after); their calls' holds are settled then, not at hold_ttl."}),
		SessionCheckStops: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_session_check_stops_total",
			Help: "Session runs this process stopped because their session's row named a newer message's run and no cancel had reached them (the sender killed before it published, or Redis out of reach)."}),
		InstanceTwins: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_instance_twins",
			Help: "Other live gateway processes serving under this process's instance name (TOLLGATE_INSTANCE), as of its last heartbeat: must be 0; above it, the processes share their leases and the reconcile lock."}),
		ActiveCalls: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_active_calls",
			Help: "Model calls being forwarded now."}),
		RequestBodyBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_request_body_bytes",
			Help: "Bytes of request bodies held in memory now (read, and kept while their calls run), against limits.max_body_memory."}),
		ResponseBodyBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_response_body_bytes",
			Help: "Bytes of non-streamed answers held in memory now (read whole before they are relayed), against limits.max_response_memory."}),
		ResponseMemoryWaits: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_response_memory_waits_total",
			Help: "Times a non-streamed answer waited for room under limits.max_response_memory, before it was read or as it grew (one that found none within 5 s was answered 503 server_busy). Rising: the bound is small for the answers in flight."}),
		Duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_duplicates_total",
			Help: "Requests answered as duplicates without running, by answer (request_in_progress, replayed, already_running, duplicate, ...)."},
			[]string{"answer"}),
		SettleSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_settle_seconds",
			Help: "Time from the end of a call to its settled row.", Buckets: fineBuckets(0.0005, 16)}),
		BatchItems: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tollgate_batch_items",
			Help:    "Items per batch transaction, by kind (settlements, admissions), counted under a kind only for the batches that carry it; a batch that holds both counts in both.",
			Buckets: []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256}}, []string{"kind"}),
		Charged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_charged_micro_usd_total",
			Help: "Micro-USD charged by the settlements this process committed, by source (the day ledger is the record)."},
			[]string{"source"}),
		Uncharged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_uncharged_micro_usd_total",
			Help: "Micro-USD of cost (less the discount) past the caps of the settlements this process committed, by source: charged to no one, " +
				"paid by the operator (an answer by a dearer model than the call's output bound was reckoned at, a prompt estimated under a " +
				"long-context line and reported past it). Rising: someone should look (the money log names each run)."},
			[]string{"source"}),
		BilledTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_billed_tokens_total",
			Help: "Tokens billed by the settlements this process committed, by kind; cache_write_1h is part of cache_write, " +
				"audio_input of input, audio_output of output."}, []string{"kind"}),
		CallPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tollgate_call_phase_seconds",
			Help: "Time a model call spends before its answer starts, by phase: auth (key lookup, on every authenticated request), body (request body read), " +
				"admit (arrival to hold committed), checks (hold to upstream request sent), upstream (sent to the upstream's " +
				"response headers), first_event (a stream's headers to its first event flushed to the caller); " +
				"admit_queue and admit_tx split admit's wait for the batch writer (queue, then its transaction).",
			Buckets: fineBuckets(0.0001, 4)}, []string{"phase"}),
	}
	reg.MustRegister(m.Requests, m.ErrorAnswers, m.Settlements, m.SettleFailures, m.TallyFailures, m.ReconcileHold, m.Reconciled, m.DeadInstances, m.SessionCheckStops, m.InstanceTwins, m.ReconcilePasses,
		m.ActiveCalls, m.RequestBodyBytes, m.ResponseBodyBytes, m.ResponseMemoryWaits, m.SettleSeconds, m.Duplicates, m.BatchItems, m.Charged, m.Uncharged, m.BilledTokens, m.CallPhase)
	m.authPhase = m.CallPhase.WithLabelValues(phaseAuth)
	m.bodyPhase = m.CallPhase.WithLabelValues(phaseBody)
	m.firstEventPhase = m.CallPhase.WithLabelValues(phaseFirstEvent)
	m.admitPhase = m.CallPhase.WithLabelValues(phaseAdmit)
	m.checksPhase = m.CallPhase.WithLabelValues(phaseChecks)
	m.upstreamPhase = m.CallPhase.WithLabelValues(phaseUpstream)
	m.admitQueuePhase = m.CallPhase.WithLabelValues(phaseAdmitQueue)
	m.admitTxPhase = m.CallPhase.WithLabelValues(phaseAdmitTx)
	m.chargedBy = map[string]prometheus.Counter{}
	for _, src := range holds.SettleSources {
		m.chargedBy[src] = m.Charged.WithLabelValues(src)
	}
	for i, kind := range tokenKinds {
		m.billed[i] = m.BilledTokens.WithLabelValues(kind)
	}
	return m
}

// fineBuckets are latency bounds from lo to hi seconds, each about 26 % above the one before
// (46 of them). make bench reads its percentiles from these histograms, interpolating inside a
// bucket: with bounds doubling, a p99 inside 32–64 ms could be read anywhere in it, which
// made a target of 50 ms undecidable.
func fineBuckets(lo, hi float64) []float64 {
	return prometheus.ExponentialBucketsRange(lo, hi, fineBucketCount)
}

const fineBucketCount = 46

// observeBatch records one batch transaction of the writer, under each kind it carries: a
// kind's mean is then how many of its items a batch that had any grouped, which a batch of
// the other kind alone, observed as 0, would dilute.
func (m *Metrics) observeBatch(b holds.BatchShape) {
	if b.Settlements > 0 {
		m.BatchItems.WithLabelValues("settlements").Observe(float64(b.Settlements))
	}
	if b.Admissions > 0 {
		m.BatchItems.WithLabelValues("admissions").Observe(float64(b.Admissions))
	}
	for _, wait := range b.AdmitWaits {
		m.admitQueuePhase.Observe(wait.Seconds())
		m.admitTxPhase.Observe(b.Took.Seconds())
	}
}

// ObserveSettled counts a committed settlement's charge and tokens: the holds.SettledHook of the
// store whose settlements these metrics show (cmd/gateway sets it).
func (m *Metrics) ObserveSettled(st holds.Settlement, res holds.Settled) {
	if res.ChargedMicro > 0 {
		c, ok := m.chargedBy[st.Source]
		if !ok {
			c = m.Charged.WithLabelValues(st.Source)
		}
		c.Add(float64(res.ChargedMicro))
	}
	if res.UnchargedMicro > 0 {
		m.Uncharged.WithLabelValues(st.Source).Add(float64(res.UnchargedMicro))
	}
	u := st.Usage.Clamp()
	for i, n := range [len(tokenKinds)]int64{u.Input, u.CacheRead, u.CacheWrite, u.Output, u.CacheWrite1h, u.AudioInput, u.AudioOutput} {
		if n > 0 {
			m.billed[i].Add(float64(n))
		}
	}
}

// MaxScrapesAtOnce bounds the /metrics scrapes served at once: it answers without a key, and
// each scrape gathers every series; past it a scrape gets 503 (a Prometheus server scrapes one
// at a time).
const MaxScrapesAtOnce = 4

// Handler serves /metrics. The bound is its own rather than promhttp's, whose refusal is a line
// of plain text: every error of the gateway has OpenAI's shape.
func (m *Metrics) Handler() http.Handler {
	gather := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	slots := make(chan struct{}, MaxScrapesAtOnce)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			gather.ServeHTTP(w, r)
		default:
			writeError(w, errScrapesBusy)
		}
	})
}

// errScrapesBusy answers a scrape past MaxScrapesAtOnce.
var errScrapesBusy = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "server_busy",
	Message: "As many /metrics scrapes are being served as may be at once; retry shortly.", RetryAfter: time.Second}

// CountError counts one error answer in ErrorAnswers: the httpapi.ErrorCounter of the writer
// countErrors puts around each request. A code not in errorCodes is counted as "other", so
// no code, however it came to be, makes a series of its own.
func (m *Metrics) CountError(status int, code string) {
	if !errorCodes[code] {
		code = "other"
	}
	m.ErrorAnswers.WithLabelValues(codeLabel(status), code).Inc()
}

// errorCodes are the codes of the error answers the gateway and its admin API write, the
// code label's values in tollgate_error_answers_total: a fixed set, so that the series are
// bounded whatever a caller sends (TestErrorCodesAreKnown finds each code in the source).
var errorCodes = func() map[string]bool {
	set := map[string]bool{}
	for _, c := range []string{
		// The model API's.
		"already_running", "audio_not_found", "billing_unavailable", "client_closed_request", "dedup_unavailable",
		"duplicate", "idempotency_key_reused", "idempotent_response_lost", "idempotent_response_too_large",
		"insufficient_credits", "internal_error", "invalid_api_key", "invalid_authorization", "invalid_idempotency_key", "invalid_json",
		"invalid_echo", "invalid_model", "invalid_models", "invalid_request", "invalid_run_id", "invalid_session_id", "invalid_stream",
		"invalid_stream_options", "item_not_found", "method_not_allowed", "missing_max_tokens", "missing_model", "model_not_found",
		"model_not_priced", "model_not_served", "model_too_long", "not_found", "previous_response_not_found",
		"request_in_progress", "request_timeout", "request_too_large", "run_budget_exhausted", "run_busy",
		"run_in_progress", "run_not_found", "run_settled", "server_busy", "shutting_down", "superseded",
		"too_many_audio_ids", "too_many_counts", "too_many_item_ids", "too_many_in_flight", "too_many_prompts", "too_many_request_bytes", "unpriced_option",
		"unreadable_body", "unsupported_content_encoding", "unsupported_parameter", "upstream_auth_failed",
		"upstream_broken", "upstream_error", "upstream_refused", "upstream_response_too_large", "upstream_timeout",
		"upstream_unreachable",
		// The admin API's.
		"admin_disabled", "body_too_large", "grant_below_zero", "invalid_admin_token", "invalid_after",
		"invalid_allowance", "invalid_amount", "invalid_discount", "invalid_format", "invalid_from", "invalid_limit",
		"invalid_max_in_flight", "invalid_name", "invalid_settled_since", "invalid_settled_until", "invalid_since",
		"invalid_to", "invalid_until", "key_not_found", "missing_key", "reports_busy", "unknown_parameter",
		"unknown_plan", "user_exists", "user_not_found",
	} {
		set[c] = true
	}
	// A bad output bound or count of answers names its field (readOutputBounds, readChoices).
	for _, rt := range routes {
		for _, f := range slices.Concat(rt.maxFields, rt.choiceFields) {
			set["invalid_"+f] = true
		}
	}
	return set
}()

// countErrors puts the writer that counts the request's error answers (httpapi.CountError)
// around it: every route's, the unknown ones' and the admin API's.
func (m *Metrics) countErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(errorCounting{ResponseWriter: w, m: m}, r)
	})
}

// errorCounting counts the error answers written to it in m. Unwrap lets
// http.ResponseController reach the connection's flush and deadlines.
type errorCounting struct {
	http.ResponseWriter
	m *Metrics
}

func (w errorCounting) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w errorCounting) CountError(status int, code string) { w.m.CountError(status, code) }

// codeLabel is the code label of tollgate_requests_total for a status answered. An upstream's
// 2xx answers and 4xx refusals reach the caller with the upstream's status, which may be any
// three digits: a status net/http does not know is counted under its class ("2xx", "4xx"), so
// an upstream cannot make up a series per answer.
func codeLabel(status int) string {
	if http.StatusText(status) != "" || status == statusClientClosed {
		return strconv.Itoa(status)
	}
	if status < 100 || status > 999 {
		return "other"
	}
	return strconv.Itoa(status/100) + "xx"
}
