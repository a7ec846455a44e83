package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/metering"
)

// countTokensPath is Anthropic's token counter. Claude Code asks it at every turn how large
// its context is (to decide when to compact it), and only falls back on its own estimate when
// the answer is not a 2xx. The provider does not bill it, so the gateway forwards it — no
// hold, no metering, no charge — to the Anthropic upstream that serves the model, with the
// gateway's key, and relays the count alone (countOf). It is refused as a model call would be
// (bad key, unpriced model, a model no Anthropic upstream serves, a body that is not a JSON
// object), so a caller cannot use it to reach an upstream it could not call.
const countTokensPath = anthropicPath + "/count_tokens"

// maxCountsInFlight bounds a caller's token counts in flight in one process. A count takes no
// hold, so nothing else bounds them, and each spends the operator's request quota at the
// provider; Claude Code's editor extension sends a few dozen in its first second.
const maxCountsInFlight = 16

// maxCountAnswer bounds what is read of a count's answer ({"input_tokens":N}).
const maxCountAnswer = 64 << 10

// countRetryAfter is what a count refused for the bound tells the caller to wait.
const countRetryAfter = time.Second

// countTokens forwards a token count.
func (s *Server) countTokens(w http.ResponseWriter, r *http.Request) {
	user := userFrom(r.Context())
	// Named as a model call is (serveCall), though a count makes no run: a caller quoting the
	// id of a refused count finds the line that says why.
	requestID := newRunID()
	w.Header().Set(RequestIDHeader, requestID)
	log := s.log.WithLazy(zap.Uint64("user_id", user.ID), zap.String("route", countTokensPath), zap.String("request_id", requestID))
	status := http.StatusInternalServerError // a panic's, as serveCall counts it
	defer func() { s.metrics.Requests.WithLabelValues(countTokensPath, codeLabel(status)).Inc() }()
	status = s.forwardCount(w, r, user.ID, log)
}

// forwardCount serves countTokens and returns the status answered.
func (s *Server) forwardCount(w http.ResponseWriter, r *http.Request, userID uint64, log *zap.Logger) int {
	refuse := func(e *apiError, reason string) int {
		logRefusalAs(log, "token count refused", e, reason, nil)
		writeError(w, e)
		return e.Status
	}
	// Refused once the drain began, as a model call is (serveCall), before its body is read: a
	// count let in then would spend the operator's request quota at the provider for an answer
	// the exiting process may cut. It holds nothing, so the drain does not wait for one let in
	// before (the listener's shutdown does, for shutdown_timeout).
	if s.calls.isClosed() {
		return refuse(errShuttingDown, "shutting down")
	}
	// Cut at the drain deadline as a call is (CutCalls): a slow upstream's count otherwise held
	// the listener's shutdown, and the exit, past shutdown_timeout, and its caller, whose
	// connection was then closed under it, got no answer instead of 503 shutting_down. Cut
	// with its own cause, so that it is told it was charged nothing (errCountCutAtShutdown).
	r, uncut := s.cuttableAs(r, errCountCut)
	defer uncut()
	if aerr := checkContentEncoding(r.Header); aerr != nil {
		return refuse(aerr, "content encoding")
	}
	lease := s.bodies.lease(userID)
	defer lease.release()
	body, aerr := readBody(w, r, s.cfg.Limits.MaxBodyBytes, s.cfg.Limits.ClientWriteTimeout, lease)
	if aerr != nil {
		return refuse(aerr, "body")
	}
	root, aerr := parseObject(body)
	if aerr != nil {
		return refuse(aerr, "validation")
	}
	if k, ok := repeatedKey(root, "model"); ok {
		// The gateway would pick the upstream by one model, the provider count for another.
		return refuse(errRepeatedKey(k), "validation")
	}
	m, aerr := s.servedModel(root, countTokensPath, "anthropic")
	if aerr != nil {
		return refuse(aerr, "validation")
	}
	if !s.counting.enter(userID) {
		return refuse(&apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "too_many_counts",
			Message: fmt.Sprintf("At most %d token counts in flight per caller.", maxCountsInFlight), RetryAfter: countRetryAfter}, "counts in flight")
	}
	defer s.counting.leave(userID)

	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.HeaderTimeout)
	defer cancel()
	up, err := s.upstreamRequest(ctx, r, m.upstream, countTokensPath, body)
	if err != nil {
		log.Error("build upstream request", zap.Error(loggedUpstreamErr(m.upstream, err)))
		writeError(w, errBuildUpstream)
		return http.StatusInternalServerError
	}
	resp, err := s.client.Do(up)
	if err != nil {
		if requestEnded(r) {
			// A caller that only half-closed still reads: unanswered, it got 200 and no count.
			// Logged as a model call's 499 is, apart from the upstream's failures below; one
			// the drain's deadline cut is told 503 shutting_down (ended).
			e, why := ended(r.Context(), "while the upstream counted")
			return refuse(e, why)
		}
		log.Warn("upstream request failed", zap.String("upstream", m.upstream.Name), zap.Error(loggedUpstreamErr(m.upstream, err)))
		e := &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_unreachable", Message: "The upstream could not be reached."}
		if isTimeout(err) {
			e = &apiError{Status: http.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout", Message: "The upstream did not answer in time."}
		}
		writeError(w, e)
		return e.Status
	}
	defer resp.Body.Close()
	redactHeaderKey(resp.Header, m.upstream.APIKey) // relayed with the count, as a model call's
	// The provider's id of the count goes with every answer to it, the gateway's own words
	// included (its 5xx, an answer that is no count), and with its later log lines, as a model
	// call's does (forward): such a failure is traced at the provider by it.
	copyUpstreamHeaders(w.Header(), resp.Header, upstreamTraceHeaders)
	if f, ok := upstreamRequestID(resp, m.upstream); ok {
		log = log.With(f)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return s.relayUpstreamError(w, r, resp, m.upstream, log, "token count refused")
	}
	return relayCount(w, r, resp, m.upstream, log)
}

// relayCount relays the count of the upstream's 2xx answer, rebuilt from its figures alone
// (countOf), or answers 502 when the answer is broken, too large or holds no count.
func relayCount(w http.ResponseWriter, r *http.Request, resp *http.Response, up *config.Upstream, log *zap.Logger) int {
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxCountAnswer+1))
	upstream := up.Name
	if err != nil && requestEnded(r) {
		// The read failed because the caller left, or the drain's deadline cut the count, not
		// the upstream: answered (a caller that only half-closed still reads) and counted as
		// the caller's, or as cut, as before the headers came.
		e, why := ended(r.Context(), "while the upstream's count was read")
		logRefusalAs(log, "token count refused", e, why, loggedUpstreamErr(up, err))
		writeError(w, e)
		return e.Status
	}
	if err != nil && isTimeout(err) {
		// limits.header_timeout bounds the whole count: one whose body stalls past it did not
		// answer in time, as one whose headers did not come.
		log.Warn("upstream count answer too slow", zap.String("upstream", upstream), zap.Int("bytes", len(answer)), zap.Error(loggedUpstreamErr(up, err)))
		writeError(w, &apiError{Status: http.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout",
			Message: "The upstream did not answer in time."})
		return http.StatusGatewayTimeout
	}
	if err != nil || len(answer) > maxCountAnswer {
		log.Warn("upstream count answer unreadable", zap.String("upstream", upstream), zap.Int("bytes", len(answer)), zap.Error(loggedUpstreamErr(up, err)))
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: "The upstream's answer to the token count was broken or too large."})
		return http.StatusBadGateway
	}
	count, ok := countOf(answer)
	if !ok {
		log.Warn("upstream count answer is not a count", zap.String("upstream", upstream), zap.Int("bytes", len(answer)))
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: "The upstream's answer to the token count was not a count."})
		return http.StatusBadGateway
	}
	copyAnswerHeaders(w.Header(), resp.Header)
	w.Header().Del("Content-Encoding") // the count is rebuilt as plain JSON
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(count)))
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(count) // bounded by boundReplies
	return resp.StatusCode
}

// countOf rebuilds a token count from the figures of the upstream's answer alone:
// input_tokens, and context_management.original_input_tokens where Anthropic's beta adds it.
// A count is free because it is a number: an upstream that answers the counter's path with
// anything else (a compatible server or proxy that serves every path under /v1/messages as a
// model call) would otherwise hand the caller, uncharged, what the model wrote. ok is false
// for an answer with no count.
func countOf(answer []byte) (count []byte, ok bool) {
	if !wholeJSON(answer) {
		return nil, false
	}
	root := gjson.ParseBytes(metering.TrimBody(answer))
	tokens := func(v gjson.Result) (string, bool) {
		n, err := strconv.ParseInt(v.Raw, 10, 64)
		return strconv.FormatInt(n, 10), v.Type == gjson.Number && err == nil && n >= 0
	}
	in, ok := tokens(root.Get("input_tokens"))
	if !ok {
		return nil, false
	}
	if orig, ok := tokens(root.Get("context_management.original_input_tokens")); ok {
		return []byte(`{"context_management":{"original_input_tokens":` + orig + `},"input_tokens":` + in + `}`), true
	}
	return []byte(`{"input_tokens":` + in + `}`), true
}

// inFlightCounts counts each caller's requests in flight, up to a bound.
type inFlightCounts struct {
	mu    sync.Mutex
	n     map[uint64]int
	bound int
}

func newInFlightCounts(bound int) *inFlightCounts {
	return &inFlightCounts{n: make(map[uint64]int), bound: bound}
}

// enter counts one more request of userID, or reports false when it has bound in flight.
func (c *inFlightCounts) enter(userID uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[userID] >= c.bound {
		return false
	}
	c.n[userID]++
	return true
}

// leave ends one of userID's requests; the map keeps only callers with some in flight.
func (c *inFlightCounts) leave(userID uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[userID]--; c.n[userID] <= 0 {
		delete(c.n, userID)
	}
}
