package proxy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/httpapi"
)

// apiError is an answer in OpenAI's error shape, which every SDK already knows how to read:
// {"error":{"message","type","code"}} (Anthropic's on its route: see anthropicErrors). It is
// not an error value: handlers return it beside their errors, so a nil *apiError can never
// become a non-nil error.
type apiError struct {
	Status     int
	Type       string
	Code       string
	Message    string
	RetryAfter time.Duration
	RunID      string // the run a duplicate refers to, when there is one
	// NoRetry: the answer cannot change on a retry. OpenAI and Anthropic SDKs retry every 409
	// (and 408, 429, 5xx) unless told otherwise by X-Should-Retry.
	NoRetry bool
}

// statusClientClosed is what a request whose caller left is counted as (nginx's 499), in the
// metrics and logs apart from the gateway's own failures. It is also sent (answerClientClosed):
// a caller that only half-closed still reads the answer.
const statusClientClosed = 499

// errClientClosed is a refusal for a caller that has left: refuse counts it and writes it to
// a connection nobody reads.
var errClientClosed = &apiError{Status: statusClientClosed, Type: "api_error", Code: "client_closed_request",
	Message: "The client closed the request."}

// answerClientClosed answers a call that ended because its caller's request did (nothing sent
// yet) with errClientClosed, and returns its status. net/http cancels a request whose caller
// half-closes its connection (shuts down its sending side once the request is sent) as one that
// left, though that caller still reads: an answer left unwritten went out as 200 with an empty
// body, which it took for a success. To a caller that has really left the write goes nowhere
// (bounded by boundAnswerEnd). A call superseded by a newer message of its session is answered
// by answerSuperseded instead.
//
// A call the gateway cut at its drain deadline (CutCalls) ends the same way, but its caller is
// still there: it is told so (errCutUncharged: every call answered here is charged nothing),
// and its status is that answer's.
func answerClientClosed(w http.ResponseWriter, r *http.Request) int {
	if errors.Is(context.Cause(r.Context()), errSuperseded) {
		return statusClientClosed
	}
	e, _ := ended(r.Context(), "")
	writeError(w, e)
	return e.Status
}

// answerCallEnded is answerClientClosed for a forwarded call c, whose answer says it is not to
// be retried when c is charged (writeCallError): a call cut at the drain deadline after the
// provider had it is answered 503 shutting_down, which the SDKs retried on another instance,
// charged again.
func answerCallEnded(w http.ResponseWriter, r *http.Request, c *call) int {
	if errors.Is(context.Cause(r.Context()), errSuperseded) {
		return statusClientClosed
	}
	e, _ := endedCall(r, c, "")
	writeCallError(w, c, e)
	return e.Status
}

// logEndedBeforeAnswer writes the line of a forwarded call whose request ended (its caller
// left, or the drain's deadline cut it) before its answer began, during step: the answer
// answerCallEnded gives it (499 client_closed_request, 503 shutting_down), as a call
// refused before forwarding logs it, with its run, which may be charged its prompt's
// estimate. Without it such a caller's 499 or 503 could not be traced in the log. A call a
// newer message of its session replaced is logged when the cancel is delivered (cancelBus).
func logEndedBeforeAnswer(c *call, r *http.Request, step string, err error) {
	if errors.Is(context.Cause(r.Context()), errSuperseded) {
		return
	}
	e, why := endedCall(r, c, step)
	logRefusalAs(c.log, "call ended before its answer", e, why, loggedUpstreamErr(c.req.upstream, err))
}

// ended is the answer, and the log line's reason, for a call charged nothing whose context
// ended during step: the gateway cut it at its drain deadline (errCutUncharged), or its caller
// left.
func ended(ctx context.Context, step string) (*apiError, string) {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errCountCut):
		return errCountCutAtShutdown, "cut at the drain deadline " + step
	case errors.Is(cause, errDrainDeadline):
		return errCutUncharged, "cut at the drain deadline " + step
	}
	return errClientClosed, "client left " + step
}

// endedCall is ended for forwarded call c, its outcome set: cut and charged (c.charged), it is
// told it is charged what it used (errCutAtShutdown). Told that whatever it cost, a caller cut
// before the provider had its request, or refused by it, was told of a charge it never got.
func endedCall(r *http.Request, c *call, step string) (*apiError, string) {
	e, why := ended(r.Context(), step)
	if e == errCutUncharged && c.charged() {
		e = errCutAtShutdown
	}
	return e, why
}

// logRefusal writes a refused request's one line, "request refused": the status and code its
// caller got, why (reason), and the error behind it, if any. The caller's own mistakes (4xx,
// and 499: it left) are INFO; the gateway's failures (5xx) WARN, not ERROR: nothing was held
// or charged, the requests are counted in tollgate_requests_total, and /readyz and the
// store's own lines say what is down. Lines below ERROR are sampled (cmd/gateway's logger),
// so neither a client's flood of bad requests nor the requests of an outage fill the disk.
func logRefusal(log *zap.Logger, e *apiError, reason string, err error, fields ...zap.Field) {
	logRefusalAs(log, "request refused", e, reason, err, fields...)
}

// logRefusalAs is logRefusal under another line's message (a token count's refusal is no
// model call's).
func logRefusalAs(log *zap.Logger, msg string, e *apiError, reason string, err error, fields ...zap.Field) {
	// The message is what the caller was told: for a body refused, which part and why (its
	// code alone says only that it was refused).
	fields = append(fields, zap.String("code", e.Code), zap.Int("status", e.Status), zap.String("reason", reason),
		zap.String("message", logged(e.Message)))
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	if e.Status >= 500 {
		log.Warn(msg, fields...)
		return
	}
	log.Info(msg, fields...)
}

// maxLoggedBytes bounds what a log line quotes of anything an upstream or a caller sent (a
// body's start, an error message, a header value): enough to tell what it was, and a log that
// a hostile peer cannot fill.
const maxLoggedBytes = 512

// logged is the start of s a log line quotes (maxLoggedBytes). What an upstream sent, or an
// error of a call to it, is quoted by loggedUpstream instead, which leaves its key out.
func logged[T ~string | ~[]byte](s T) T { return s[:min(len(s), maxLoggedBytes)] }

// maxQuotedBytes bounds what an error answer quotes of a value its caller sent (a repeated
// key and the objects above it, a fallback model's name, an option's value): as long as the
// longest id the gateway looks up (maxContinuedID) and twice the longest model name a hold
// stores (holds.MaxModelLen), enough to tell which value it was. Quoted whole, a refusal
// grew with the body it refused, up to six times max_body_bytes once JSON-escaped (each '<'
// is sent as \u003c), built in memory beside the body, which alone the body bounds count, and
// written before anything was held: any key could ask for it, one without credits too.
const maxQuotedBytes = 256

// quotedValue is the start of s an error answer quotes: all of it up to maxQuotedBytes, else
// its first maxQuotedBytes at most, cut at the start of a rune and marked "…".
func quotedValue(s string) string {
	if len(s) <= maxQuotedBytes {
		return s
	}
	cut := maxQuotedBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func errBadRequest(code, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Message: msg}
}

var (
	errBadKey = &apiError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key",
		Message: "Invalid or missing API key. Send it as 'Authorization: Bearer <key>' (or 'x-api-key: <key>' on /v1/messages and /v1/models)."}
	errInsufficient = &apiError{Status: http.StatusPaymentRequired, Type: "insufficient_quota", Code: "insufficient_credits",
		Message: "No credits available: today's allowance and prepaid credits are used or held by calls in flight."}
	// errPromptOverCap is insufficient_credits after the hold was taken: the balance is not
	// empty, but what this call may spend (its cap: the plan's max_run_cost_credits, or less
	// when less is available) does not pay for its prompt and the least answer. Worded apart
	// from errInsufficient so that a caller with credits left is not told it has none.
	errPromptOverCap = &apiError{Status: http.StatusPaymentRequired, Type: "insufficient_quota", Code: "insufficient_credits",
		Message: "This prompt and the least answer cost more than this call may spend (the plan's cap per call, or what is available when that is less); nothing was charged."}
	errBillingDown = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "billing_unavailable",
		Message: "Billing is unavailable, so the call was not made. Retry shortly.", RetryAfter: time.Second}
	errShuttingDown = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "shutting_down",
		Message: "The gateway is shutting down, so the call was not made. Retry.", RetryAfter: time.Second}
	// errCutAtShutdown answers a call still running at the drain deadline of a graceful
	// shutdown (CutCalls): it is charged what it used, as a call whose caller left.
	errCutAtShutdown = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "shutting_down",
		Message:    "The gateway is shutting down and cut this call at its drain deadline; it is charged what it used, and a retry is run and charged again.",
		RetryAfter: time.Second}
	// errCutUncharged answers a call cut at the drain deadline that is charged nothing: cut
	// before it was forwarded (its hold released at 0), before the provider had it, or while
	// the provider's refusal was read. errCutAtShutdown's words told it of a charge.
	errCutUncharged = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "shutting_down",
		Message:    "The gateway is shutting down and cut this call at its drain deadline; nothing is charged. Retry.",
		RetryAfter: time.Second}
	// errCountCutAtShutdown answers a token count still running at the drain deadline: a count
	// is never charged, and errCutAtShutdown's words told its caller it was.
	errCountCutAtShutdown = &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "shutting_down",
		Message:    "The gateway is shutting down and cut this token count at its drain deadline; nothing is charged. Retry.",
		RetryAfter: time.Second}
	errNotFound = &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
		Message: "No such route."}
	errRunNotFound = &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "run_not_found",
		Message: "No such run."}
	errRunSettled = &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "run_settled",
		Message: "This run is already settled; start a new run id.", NoRetry: true}
	// errBuildUpstream is the gateway's own failure to make the upstream request of a body it
	// accepted (every field it rewrites was checked when the body was read): not the caller's.
	errBuildUpstream = &apiError{Status: http.StatusInternalServerError, Type: "api_error", Code: "internal_error",
		Message: "Could not build the upstream request."}
)

// writeError sends e, in Anthropic's shape to a caller of the Anthropic route (see
// anthropicErrors) and in OpenAI's to everyone else. Every error answer the gateway writes
// itself passes here, so it is counted here, once (tollgate_error_answers_total, through the
// writer countErrors put around the request). An error event that ends a stream already
// under way is not written here and not counted: that call was served, its 200 sent.
func writeError(w http.ResponseWriter, e *apiError) {
	httpapi.CountError(w, e.Status, e.Code)
	h := w.Header()
	if e.NoRetry && h.Get(shouldRetryHeader) == "" {
		h.Set(shouldRetryHeader, "false")
	}
	if e.RetryAfter > 0 {
		httpapi.SetRetryAfter(h, e.RetryAfter)
	}
	if id := h.Get(RequestIDHeader); id != "" && h.Get("X-Request-Id") == "" && h.Get("Request-Id") == "" {
		// The SDKs name a failed call by its answer's request id (the Anthropic SDK's error
		// message quotes Request-Id; the OpenAI SDKs keep X-Request-Id), and that is what a
		// user reports. An error no provider answered names the gateway's request, as its log
		// lines do; one a provider answered keeps the provider's (upstreamTraceHeaders).
		if anthropicCaller(w) {
			h.Set("Request-Id", id)
		} else {
			h.Set("X-Request-Id", id)
		}
	}
	body := httpapi.ErrorBody(e.Message, e.Type, e.Code)
	if e.RunID != "" {
		body["run_id"] = e.RunID
	}
	envelope := map[string]any{"error": body}
	if anthropicCaller(w) {
		body["type"] = anthropicErrorType(e.Status)
		envelope["type"] = "error"
	}
	httpapi.WriteJSON(w, e.Status, envelope)
}

// writeCallError sends e as the answer to the forwarded call c, which ended as c.outcome says.
// A call charged for what the provider did (c.charged) is told not to be retried: the OpenAI
// and Anthropic SDKs resend a 408, 409, 429 or 5xx by themselves, twice by default, unless
// X-Should-Retry says otherwise, and each resend is a call of its own, charged again, for an
// answer the caller never sees. Its Retry-After goes too: it would invite the same retry. A
// failure charged nothing keeps its advice, and the SDK's retry costs nothing more.
func writeCallError(w http.ResponseWriter, c *call, e *apiError) {
	if c.charged() {
		e = chargedFailure(e)
	}
	writeError(w, e)
}

// chargedFailure is e answered to a call that was charged: not to be retried, and no wait
// advised before a retry.
func chargedFailure(e *apiError) *apiError {
	charged := *e
	charged.NoRetry, charged.RetryAfter = true, 0
	return &charged
}

// anthropicErrors marks the response of a request to the Anthropic route, /v1/messages (and
// paths under it: its token counter, and those the gateway does not serve). Anthropic's clients
// read an error as {"type":"error","error":{"type","message"}} and name its class by
// error.type (billing_error, rate_limit_error, ...), which differs from OpenAI's for the same
// status; the gateway's own code and run id ride along in error, where Anthropic may add
// fields. Errors the upstream sent pass through as it sent them.
type anthropicErrors struct{ http.ResponseWriter }

// Unwrap lets http.ResponseController reach the connection's flush and deadlines.
func (w anthropicErrors) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// shapeErrors makes the errors of requests to the Anthropic route Anthropic's.
func shapeErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; p == anthropicPath || strings.HasPrefix(p, anthropicPath+"/") {
			w = anthropicErrors{w}
		}
		next.ServeHTTP(w, r)
	})
}

const anthropicPath = "/v1/messages"

// anthropicCaller reports whether w, or a writer it wraps, answers the Anthropic route.
func anthropicCaller(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case anthropicErrors:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

// anthropicErrorType is Anthropic's error type for status, as its API documents them; other
// 4xx are invalid_request_error, as Anthropic uses it.
func anthropicErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusPaymentRequired:
		return "billing_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusGatewayTimeout:
		return "timeout_error"
	case status >= 400 && status < 500:
		return "invalid_request_error"
	default:
		return "api_error"
	}
}
