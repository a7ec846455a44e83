package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tollgate/tollgate/metering"
	"go.uber.org/zap"
)

// relayBody copies a non-streamed answer, bounded by max_response_bytes, and all such answers
// in memory at once by max_response_memory.
func (s *Server) relayBody(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call) int {
	limit := s.cfg.Limits.MaxResponseBytes
	if resp.ContentLength > limit {
		// Too large by its own word: metered from its head and the rest as they come, never
		// held whole, so it waits for no room (refused for room, it was a 503 its SDK retried,
		// charged again each time, where it is a 502 not to be retried).
		return s.answerOversized(w, r, resp, c, nil, limit)
	}
	counted := s.answers.buffer(c.user.ID)
	defer counted.release()
	body, err := counted.readAll(r.Context(), resp.Body, resp.ContentLength, limit)
	if errors.Is(err, errAnswerMemoryFull) {
		return s.answerMemoryFull(w, r, resp, c, body, limit, err)
	}
	if err != nil {
		// Broken, out of time, or its caller left: charged the output it had sent, as a
		// stream cut there is.
		meterCut(c.meter, body)
		return answerBodyFailure(w, r, c, err)
	}
	if int64(len(body)) > limit {
		return s.answerOversized(w, r, resp, c, body, limit)
	}
	if status := refuseUnrelayable(w, c, resp, body); status != 0 {
		return status
	}
	s.meterWhole(r.Context(), c, body)
	if c.req.stream && c.req.route.injectUsage && !c.req.clientAskedUsage {
		// A stream under another label, sent whole, is still the stream the caller asked
		// for: the usage-only chunk asked for on its behalf is removed, as relayStream
		// removes it (metered above, it is still what the call is charged).
		body = withoutUsageChunks(body)
	}
	return s.writeWhole(w, r, resp, c, body)
}

// withoutUsageChunks is body, an event stream read whole, less its usage-only chunks
// (metering.IsUsageOnlyChunk), every other byte as it came; a JSON body, or one with no such
// chunk, is returned as it is. Every event of it is read, whatever its size
// (metering.NewBodyScanner), as it is metered (meterBody): a chunk past an event larger than
// limits.max_event_bytes is removed too.
func withoutUsageChunks(body []byte) []byte {
	if t := metering.TrimBody(body); len(t) == 0 || t[0] == '{' || t[0] == '[' ||
		!bytes.Contains(body, []byte(`"usage"`)) {
		return body
	}
	sc := metering.NewBodyScanner(body)
	out := make([]byte, 0, len(body))
	strip := usageChunkStrip{on: true}
	read, stripped := 0, false
	for {
		ev, err := sc.Next()
		if err != nil {
			break
		}
		read += len(ev.Raw)
		raw, kept := strip.pass(ev)
		stripped = stripped || !kept
		out = append(out, raw...)
	}
	if !stripped {
		return body
	}
	return append(out, body[read:]...)
}

// answerBodyFailure answers a call whose upstream answer could not be read to its end, and
// sets c.outcome by who ended it: the caller, the upstream's time, or a broken connection.
func answerBodyFailure(w http.ResponseWriter, r *http.Request, c *call, err error) int {
	if requestEnded(r) {
		c.outcome = outcomeCancel
		logEndedBeforeAnswer(c, r, "while the upstream's answer was read; charged what it used", err)
		return answerCallEnded(w, r, c)
	}
	if isTimeout(err) {
		// The provider has the prompt and was still answering when the gateway gave up: as
		// for a timeout before its headers, charge the prompt's estimate and say so.
		c.outcome = outcomeUpstreamTimeout
		c.log.Warn("upstream body timed out", zap.Error(loggedUpstreamErr(c.req.upstream, err)))
		writeCallError(w, c, &apiError{Status: http.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout",
			Message: "The upstream did not finish the answer in time."})
		return http.StatusGatewayTimeout
	}
	c.outcome = outcomeStreamError
	c.log.Warn("upstream body broke", zap.Error(loggedUpstreamErr(c.req.upstream, err)))
	writeCallError(w, c, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
		Message: "The upstream connection broke before the answer was complete."})
	return http.StatusBadGateway
}

// answerOversized answers 502 an answer past limit (body holds what of it was read: its first
// limit+1 bytes, or none when its Content-Length says so), once it is metered from what more of
// it can be read. One that breaks before the limit (a Content-Length that said more than came)
// is answered as any answer that breaks.
func (s *Server) answerOversized(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, body []byte, limit int64) int {
	read, broke := meterUnrelayed(c, body, &brokenRead{r: resp.Body}, limit, s.cfg.Limits.MaxEventBytes)
	if broke != nil && read <= limit {
		return answerBodyFailure(w, r, c, broke)
	}
	c.log.Warn("upstream body over the limit", zap.Int64("limit", limit), zap.Int64("read", read),
		zap.Bool("usage_found", c.meter.Result().Reported))
	// Charged the whole answer it cannot pass on: an SDK's automatic retry of a 502 (twice,
	// by default) would be answered as large again, and charged again, for nothing.
	writeCallError(w, c, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_response_too_large",
		Message: fmt.Sprintf("The upstream answer is larger than %d bytes.", limit), NoRetry: true})
	return http.StatusBadGateway
}

// answerMemoryFull answers 503 an answer that found no room among the whole answers in memory,
// the process's or its caller's share of them (full says which; body holds what of it was
// read), once it is metered from what more of it can be read, as
// answerOversized does. The provider made it, and it is charged what it used, as a call cut at
// the drain deadline of a shutdown is: the gateway cannot tell a caller that would have paid
// for it from one that would not.
func (s *Server) answerMemoryFull(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, body []byte, limit int64, full error) int {
	rest := &brokenRead{r: resp.Body}
	head := readHead(body, rest)
	if rest.err == nil && webPage(head) {
		// As relayBody would have refused it: no model's answer, charged nothing.
		return refuseNonAnswer(w, c, resp, head, "upstream answered with a web page",
			"The upstream answered with a web page, not an API answer: is its base_url right?")
	}
	read, broke := meterUnrelayed(c, head, rest, limit, s.cfg.Limits.MaxEventBytes)
	if broke != nil {
		return answerBodyFailure(w, r, c, broke) // the caller left, the upstream's time ran out, or it broke
	}
	callers := errors.Is(full, errCallerAnswerMemory)
	c.log.Warn("upstream answer found no room in memory", zap.Int64("read", read), zap.Bool("usage_found", c.meter.Result().Reported),
		zap.Bool("callers_share", callers))
	msg := "The gateway holds as many answers in memory as it may and could not pass this one on; it is charged what it used, and a retry is charged again."
	if callers {
		msg = "Your answers not yet read hold as many bytes of the gateway's memory as one caller may, and this one could not be passed on; " +
			"it is charged what it used. Read your other answers before you retry; a retry is charged again."
	}
	writeCallError(w, c, &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "server_busy", Message: msg, RetryAfter: bodyRetryAfter})
	return http.StatusServiceUnavailable
}

// meterUnrelayed meters an answer that is not relayed after all (head holds what of it was
// read) from the rest of it, read and discarded up to oversizeReadFactor times limit, and
// marks the call as one whose answer broke. It returns how much of the answer was read in all,
// and the error its read ended with, if it broke (nil when it ended, or reached its bound). It
// reads before the error goes out: a caller that has its answer leaves, and the upstream read,
// bound to its context, would end before the report. An event stream under another label is
// metered by its events, as relayBody meters one read whole (meterBody), but each held up to
// maxEvent bytes: the answer is read past, not held.
func meterUnrelayed(c *call, head []byte, rest *brokenRead, limit int64, maxEvent int) (int64, error) {
	c.outcome = outcomeStreamError
	head = readHead(head, rest)
	if rest.err != nil {
		// Broken within its head (a body cut short reads as a clean end after its first
		// error): it has no report of its own, and is charged the output it had sent.
		meterCut(c.meter, head)
		return int64(len(head)), rest.err
	}
	most := int64(math.MaxInt64)
	if limit <= math.MaxInt64/oversizeReadFactor {
		most = oversizeReadFactor * limit
	}
	if t := metering.TrimBody(head); len(t) > 0 && t[0] != '{' && t[0] != '[' {
		// Events under another label (a streamed call's answer labelled application/json):
		// read as JSON it is no object, and its output, which the same stream relayed whole
		// is charged, was charged nothing. A JSON array (a provider's native answer) is read
		// past as before, for a report at its end.
		past := &countedRead{r: io.LimitReader(rest, most)}
		meterEvents(c.meter, io.MultiReader(bytes.NewReader(head), past), maxEvent)
		_, _ = io.Copy(io.Discard, past) // past an event too large or cut, read to the bound as any answer
		return int64(len(head)) + past.n, rest.err
	}
	read := meterOversized(c.meter, head, rest, most)
	return int64(len(head)) + read, rest.err
}

// countedRead is a reader that counts the bytes read from it.
type countedRead struct {
	r io.Reader
	n int64
}

func (c *countedRead) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// brokenRead is a reader that keeps the first error, other than io.EOF, its reads ended with:
// a body that breaks says so once (a Content-Length that said more than came, as
// io.ErrUnexpectedEOF), then reads as ended.
type brokenRead struct {
	r   io.Reader
	err error
}

func (b *brokenRead) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && b.err == nil {
		b.err = err
	}
	return n, err
}

// unrelayedHead is how much of an answer not relayed is read first, for the model that
// answered (the first key of most answers; an answer refused for room or for its
// Content-Length has none of it read yet).
const unrelayedHead = 64 << 10

// readHead is head with what more of rest it takes to make unrelayedHead bytes, or all of rest
// when it is shorter; a read that fails is for rest to remember (brokenRead).
func readHead(head []byte, rest io.Reader) []byte {
	if len(head) >= unrelayedHead {
		return head
	}
	more := make([]byte, unrelayedHead-len(head))
	n, _ := io.ReadFull(rest, more)
	return append(head[:len(head):len(head)], more[:n]...)
}

// refuseUnrelayable answers 502 a whole body that is no answer to relay: one cut short, a web
// page, or text of no format. It returns 0 for a body to meter and relay.
func refuseUnrelayable(w http.ResponseWriter, c *call, resp *http.Response, body []byte) int {
	if len(metering.TrimBody(body)) == 0 {
		// A 200 with nothing in it is no answer (no SDK reads one), and may be an answer cut
		// before its first byte: broken, as one cut later is. Relayed, it ended complete and
		// pinned an Idempotency-Key to nothing for a day.
		c.outcome = outcomeStreamError
		c.log.Warn("upstream answered an empty body", zap.Int("bytes", len(body)))
		writeCallError(w, c, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: "The upstream answered with an empty body."})
		return http.StatusBadGateway
	}
	if cutJSON(body) || c.req.route.format == metering.FormatCompletions && cutAnswers(body) {
		// A JSON answer that is not whole came from an upstream that went away mid-answer
		// while its body was delimited by the connection's close (which reads as a clean
		// end): as when it breaks a Content-Length. Metered, a usage object cut mid-number
		// was charged as the provider's word ("completion_tokens":4 of 400). So too an older
		// llama.cpp server's array of whole answers to a batch (metering's taskAnswers): its
		// last answer's report was read cut ("prompt_tokens":3 of 310), the answers it never
		// sent charged nothing.
		c.outcome = outcomeStreamError
		meterCut(c.meter, body)
		c.log.Warn("upstream body cut short", zap.Int("bytes", len(body)))
		writeCallError(w, c, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: "The upstream connection broke before the answer was complete."})
		return http.StatusBadGateway
	}
	// A web page — a captive portal, a proxy's or CDN's page, a base_url that names a website —
	// or other text that is neither JSON nor events (a maintenance page that opens with no
	// tag, a proxy's "upstream connect error") is no model's answer: the provider never had
	// the prompt, and the SDKs cannot read it. Relayed, it was charged the prompt's estimate on
	// every call for as long as it stood there.
	if webPage(body) {
		return refuseNonAnswer(w, c, resp, body, "upstream answered with a web page",
			"The upstream answered with a web page, not an API answer: is its base_url right?")
	}
	if noAnswer(body) {
		return refuseNonAnswer(w, c, resp, body, "upstream answered with text that is no API answer",
			"The upstream answered with text that is not an API answer.")
	}
	return 0
}

// meterWhole meters a whole answer about to be relayed and tallies what it costs, then marks
// the call's answer final: all before the answer goes out.
func (s *Server) meterWhole(ctx context.Context, c *call, body []byte) {
	meterBody(c.meter, body)
	if !c.meter.Result().Reported {
		logErrorObject(c, body)
	}
	c.outcome = c.wholeOutcome()
	if c.inRun {
		s.tallyBeforeAnswer(ctx, c)
	} else {
		s.tallyWithFingerprint(ctx, c, s.settlementOf(c))
	}
	s.answerFinal(ctx, c)
}

// writeWhole sends a whole answer, metered, to the caller under the upstream's status and
// headers, pinning an idempotent attempt's key on it first (pinBeforeAnswer).
func (s *Server) writeWhole(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, body []byte) int {
	// The upstream's headers go out only with its answer: an error answer sent instead (see
	// relayBody) must not carry its Content-Length (the caller would read a truncated body) or
	// its encoding.
	copyAnswerHeaders(w.Header(), resp.Header)
	// An error object some servers answer with a 200 may echo the operator's key and word its
	// account's ids, as their error answers may: both are left out as they are from those
	// (redactKey, redactAccountIDs; the ids only from an answer the meter read as an error,
	// since a model's answer may rightly say "org-…"). The answer was metered as it came.
	body = redactKey(body, c.req.upstream.APIKey)
	if c.meter.UpstreamError() {
		body = redactAccountIDs(body, resp.Header)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	s.pinBeforeAnswer(r.Context(), c, c.outcome, resp.StatusCode, body)
	rc := http.NewResponseController(w)
	bound := s.boundWrites(rc)
	bound.next()
	w.WriteHeader(resp.StatusCode)
	if _, err := bound.write(w, body); err != nil && c.outcome == outcomeComplete && !c.idemPinned {
		// Only a complete answer becomes a cancel: an upstream error stays one (what it is
		// charged, possibly nothing, was tallied by meterWhole, before the answer went out); a
		// pinned one stays complete, as its record says (see relayStream).
		c.outcome = outcomeCancel
	}
	// Flush now: the handler still has its deferred settlement to hand off, and the caller
	// need not wait for that.
	_ = rc.Flush()
	return resp.StatusCode
}

// meterBody meters a whole answer: a JSON body (an object, or an array: a batch's answers,
// metering.Meter.Body), or else an event stream that came under another content type (an
// upstream that left its Content-Type to sniffing gets text/plain). Either way what it
// reported, or the text it produced, is what the call is charged. The events of a stream held
// whole are read whatever their size (metering.NewBodyScanner): it is sent whole, and read with
// the bound of a streamed event, the meter stopped at an event past limits.max_event_bytes, and
// the caller had that event and all after it, the provider's report included, charged the
// estimate of what came before.
func meterBody(m *metering.Meter, body []byte) {
	if t := metering.TrimBody(body); len(t) == 0 || t[0] == '{' || t[0] == '[' {
		m.Body(body)
		return
	}
	meterScanned(m, metering.NewBodyScanner(body))
}

// meterEvents meters the events r holds, each held up to maxEvent bytes, up to the first that
// is too large or that r ends inside of with its JSON cut.
func meterEvents(m *metering.Meter, r io.Reader, maxEvent int) {
	meterScanned(m, metering.NewScanner(r, maxEvent))
}

// meterScanned meters the events sc reads, up to its first error or the first event its stream
// ends inside of with its JSON cut.
func meterScanned(m *metering.Meter, sc *metering.Scanner) {
	for {
		ev, err := sc.Next()
		if err != nil {
			return
		}
		if ev.Unterminated && cutJSON(ev.Data) {
			return // the body ended inside this event: a cut usage is no report (see relayStream)
		}
		m.Event(ev)
	}
}

// logErrorObject writes a WARN line for a successful answer whose body is an error object
// (some OpenAI-compatible servers answer a failure with a 200): it is relayed as sent and,
// without a usage report, charged nothing, and the log is where an operator sees that an
// upstream fails every call. Looked for only in answers without a usage report.
func logErrorObject(c *call, body []byte) {
	e := gjson.GetBytes(body, "error")
	if !e.IsObject() {
		return
	}
	up := c.req.upstream
	c.log.Warn("upstream answered 200 with an error object", zap.String("upstream", up.Name),
		zap.String("error_type", loggedUpstream(up, e.Get("type").String())), zap.String("error_message", loggedUpstream(up, e.Get("message").String())))
}

// logErrorEvent writes a WARN line for a stream its provider ended with its own error event
// (the SDKs raise on it): relayed as sent and settled stream_error, or upstream_error before
// any output, it is, as an error object in a whole answer is (logErrorObject), the only word
// of why a provider fails its streams. The error is where each format puts it: under "error"
// (OpenAI's chat, Anthropic's), at the top (Responses' error event), or under
// "response.error" (its response.failed).
func logErrorEvent(c *call, ev metering.Event) {
	var e gjson.Result
	for _, path := range []string{"error", "response.error", "@this"} {
		if e = gjson.GetBytes(ev.Data, path); e.IsObject() && (e.Get("message").Exists() || e.Get("code").Exists()) {
			break
		}
	}
	kind := e.Get("type").String()
	if kind == "" || kind == "error" {
		kind = e.Get("code").String()
	}
	up := c.req.upstream
	c.log.Warn("upstream ended the stream with an error", zap.String("upstream", up.Name), zap.String("event", loggedUpstream(up, ev.Name)),
		zap.String("error_type", loggedUpstream(up, kind)), zap.String("error_message", loggedUpstream(up, e.Get("message").String())))
}

// refuseNonAnswer answers a 200 that holds no model's answer 502 upstream_error, charged
// nothing, and logs its start.
func refuseNonAnswer(w http.ResponseWriter, c *call, resp *http.Response, body []byte, logMsg, message string) int {
	c.outcome = outcomeUpstreamError
	up := c.req.upstream
	c.log.Warn(logMsg, zap.String("upstream", up.Name),
		zap.String("content_type", loggedUpstream(up, resp.Header.Get("Content-Type"))), zap.String("head", loggedUpstream(up, body)))
	writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_error", Message: message})
	return http.StatusBadGateway
}

// webPage reports whether a whole answer is markup (HTML or XML) rather than JSON or events:
// its first character, past white space and a byte order mark, opens a tag. No API answer of
// any of the formats starts so.
func webPage(body []byte) bool {
	t := metering.TrimBody(body)
	return len(t) > 0 && t[0] == '<'
}

// noAnswer reports whether a whole answer is text that no format answers with: not empty, not
// JSON (an object, or an array, which a provider's native API may answer with: metered as
// before, since the provider may have worked), and no event of it carries data (an event
// stream under another label does, whatever the size of its events: metering.NewBodyScanner).
// Read with the bound of a streamed event, a stream whose first event passed it was refused as
// no answer, charged nothing, for an answer the provider made.
func noAnswer(body []byte) bool {
	if t := metering.TrimBody(body); len(t) == 0 || t[0] == '{' || t[0] == '[' {
		return false
	}
	sc := metering.NewBodyScanner(body)
	for {
		ev, err := sc.Next()
		if err != nil {
			return true
		}
		if ev.Data != nil {
			return false
		}
	}
}

// wholeJSON reports whether b is a whole JSON object (white space and a byte order mark
// around it aside).
func wholeJSON(b []byte) bool {
	t := metering.TrimBody(b)
	return len(t) > 0 && t[0] == '{' && validJSON(t)
}

// cutJSON reports whether b (an event's data, a whole body) starts as a JSON object but is not
// whole JSON: what an upstream that went away mid-answer leaves. gjson's check, not
// encoding/json's: it runs on every whole answer, and takes 8 ms where that takes 18 on a
// 7 MB list of embeddings.
func cutJSON(b []byte) bool {
	t := metering.TrimBody(b)
	return len(t) > 0 && t[0] == '{' && !validJSON(t)
}

// cutAnswers reports whether b, a whole completions body, starts as a JSON array (an older
// llama.cpp server's array of whole answers to a batch, metering.UnrelayedAnswer.Answers) but
// is not whole JSON.
func cutAnswers(b []byte) bool {
	t := metering.TrimBody(b)
	return len(t) > 0 && t[0] == '[' && !validJSON(t)
}

// validJSON is gjson.ValidBytes for what an upstream sent, with its nesting bounded first:
// gjson validates by recursive descent, a stack frame per level, and an answer or event of
// brackets alone (within max_response_bytes or max_event_bytes) grew one call's stack to
// 512 MiB for 4 MiB of them, and past Go's 1 GB limit (8 MiB; 4 under the race detector)
// killed the process, every call in flight with it. JSON nested deeper than maxJSONDepth
// is none here, as it is none in a request (parseCall) nor to encoding/json. The brackets
// are counted first (bytes.Count, far faster than the check): an answer with fewer than the
// bound in all cannot nest past it, and is not walked byte by byte again.
func validJSON(t []byte) bool {
	if bytes.Count(t, []byte{'{'})+bytes.Count(t, []byte{'['}) > maxJSONDepth && nestedDeeperThan(t, maxJSONDepth) {
		return false
	}
	return gjson.ValidBytes(t)
}

// oversizeReadFactor bounds how much of an answer too large to relay is still read for its
// usage: this many times max_response_bytes.
const oversizeReadFactor = 4

// oversizeTail is how much of the end of an answer too large to relay is kept: its usage
// report comes last, and is far smaller.
const oversizeTail = 256 << 10

// meterOversized meters an answer too large to relay from its head (the first bytes, which
// name the model) and the usage report at its end, reading and discarding the rest as it
// comes, up to most bytes. The provider bills what it made, whether or not the gateway can
// pass it on: a spoken answer in WAV passes the default 32 MiB after nine minutes, and was
// charged its prompt's estimate alone. Only an answer read to its end is metered by a report:
// the report comes last, so one cut (past most, broken, or a JSON answer that ended before its
// JSON did) has none of its own, and a "usage" object found in it would be part of the answer
// (an Anthropic tool_use input is raw JSON the caller's schema shapes); one cut is charged the
// estimate of what was read of it (meterCutPast).
// The spoken answers read past are measured as they go by (metering.UnrelayedAnswer), so that
// a report which does not say how much of the output was audio has the audio charged at the
// audio price, as the same answer read whole would: charged the report alone, it was charged
// at the text price. An answer read to its end without a report
// is charged as one read whole without one is: the prompt's estimate and its output's, from
// the text and audio measured on the way, in every format (an Anthropic message's text,
// thinking and tool inputs, a Responses answer's text and arguments, as Meter.Body counts
// them); charged the prompt's estimate alone, its output went unbilled here and billed by the
// provider. It returns how many bytes it read past head.
func meterOversized(m *metering.Meter, head []byte, rest io.Reader, most int64) int64 {
	past := m.NewUnrelayedAnswer()
	past.Write(head)
	var tail []byte
	buf := make([]byte, 32<<10)
	var read int64
	var err error
	for read < most && err == nil {
		var n int
		n, err = rest.Read(buf[:min(int64(len(buf)), most-read)])
		read += int64(n)
		past.Write(buf[:n])
		tail = append(tail, buf[:n]...)
		if len(tail) > 2*oversizeTail {
			tail = append(tail[:0], tail[len(tail)-oversizeTail:]...)
		}
	}
	ended := errors.Is(err, io.EOF)
	if err == nil {
		// Read up to the bound: the answer ended there only if nothing follows.
		var one [1]byte
		n, err := rest.Read(one[:])
		ended = n == 0 && errors.Is(err, io.EOF)
	}
	if ended && past.Open() {
		// A JSON answer that ended before its JSON did: a body the connection's close
		// delimits, cut, reads as a clean end. Read as whole, a "usage" object in it (an
		// Anthropic tool input's) was its report, and the value it was cut in counted nothing.
		ended = false
	}
	if !ended {
		// Cut at the bound, or broken (the upstream broke or ran out of time, or the caller
		// left and the upstream call with it, or its JSON was cut): no report of its own, but the output read was
		// made, and the provider bills it. It is charged as a stream cut midway is, its
		// estimate: charged the prompt's alone, an answer past the bound cost less than one a
		// little shorter read to its end, and one that broke nothing of what it had sent.
		meterCutPast(m, head, past)
		return read
	}
	if len(tail) < oversizeTail {
		tail = append(head[max(0, len(head)-(oversizeTail-len(tail))):len(head):len(head)], tail...)
	}
	model := headModel(head, past)
	if model.Type != gjson.String {
		// An embeddings list names its model after its data, a llama.cpp answer after its text.
		model = lastKey(tail, "model", '"')
	}
	if past.Answers() {
		// An older llama.cpp server's answer to a batch of prompts, a JSON array of whole
		// answers: the report at its end is its last answer's alone, and each answer's was
		// read on the way. All of them are charged, as the same answer read whole is.
		if model.Type == gjson.String {
			m.Body(append(append([]byte(`{"x":0,"model":`), model.Raw...), '}')) // a key the Meter reads in no format
		}
		m.AddAnswers(past)
		return read
	}
	whole := []byte(`{"x":0`) // a key the Meter reads in no format
	usage := lastUsage(tail)
	if usage.IsObject() {
		whole = append(append(whole, `,"usage":`...), usage.Raw...)
		// llama.cpp's server's timings, after its usage: they tell a report of one task of
		// several (metering's taskReport), whose other choices' text is charged at its
		// estimate, as the same answer read whole is (AddUnreported).
		if timings := lastObject(tail, "timings"); timings.IsObject() {
			whole = append(append(whole, `,"timings":`...), timings.Raw...)
		}
	}
	if model.Type == gjson.String {
		whole = append(append(whole, `,"model":`...), model.Raw...)
	}
	m.Body(append(whole, '}'))
	// The text and audio read past count as Meter.Body counts a whole answer's, report or no
	// report: a report that gives no figure of the output (completion_tokens absent or null,
	// no total; a whole Anthropic message without output_tokens) has its output estimated
	// from that text, as the same answer read whole has. Counted only without a report, such
	// an answer's output was billed at 0.
	m.AddUnreported(past)
	if !usage.IsObject() {
		// An older llama.cpp server's answer in its own shape (no usage: its counts, read on
		// the way, are its report), charged as the same answer read whole is.
		m.AddServerReport(past)
	}
	return read
}

// meterCut meters an answer that did not come whole — its body broke, or the upstream's time
// ran out, or its caller left and the upstream call with it — from read, all of it that was
// read. The provider made what it sent, and bills it (a non-streamed answer is made before it
// is sent): the call is charged as a stream cut at the same point is, the prompt's estimate
// and the output's, from the text and audio read (the value being read when it broke counts
// as far as it came). Charged the prompt's estimate alone, an answer that broke near its end
// cost less than one a little shorter that reached it. A report in it is not its own: the
// report comes last, and a "usage" object in a cut answer is part of its text (an Anthropic
// tool input). So too in an older llama.cpp server's array of whole answers to a batch, read
// as one (metering.UnrelayedAnswer.Answers): read whole, its last answer's cut report was
// charged as the provider's word. An event stream under another label is metered by its
// whole events, as a stream cut there is (meterBody). It keeps no more than
// what read holds already.
func meterCut(m *metering.Meter, read []byte) {
	if t := metering.TrimBody(read); len(t) > 0 && t[0] != '{' && t[0] != '[' {
		meterBody(m, read)
		return
	}
	past := m.NewUnrelayedAnswer()
	_, _ = past.Write(read)
	meterCutPast(m, read, past)
}

// meterCutPast charges an answer cut before its end the output past measured of it
// (metering.UnrelayedAnswer.Cut), at the price of the model its head names.
func meterCutPast(m *metering.Meter, head []byte, past *metering.UnrelayedAnswer) {
	past.Cut()
	m.AddUnreported(past)
	if model := headModel(head, past); model.Type == gjson.String {
		m.Body(append(append([]byte(`{"x":0,"model":`), model.Raw...), '}')) // a key the Meter reads in no format
	}
}

// headModel is the model a JSON answer's first bytes name (its top-level "model"; its first
// answer's, as Meter.Body reads it, for a JSON array of whole answers past reads), or an empty
// result when they name none whole: a name cut short is no name (cut from "gpt-4o-mini",
// "gpt-4o" bills at another model's price).
func headModel(head []byte, past *metering.UnrelayedAnswer) gjson.Result {
	path := "model"
	if past.Answers() {
		path = "0.model"
	}
	if model := gjson.GetBytes(head, path); model.Type == gjson.String && gjson.Valid(model.Raw) {
		return model
	}
	return gjson.Result{}
}

// lastUsage is the value of the last "usage" key in b (a JSON body's end, or an event
// stream's) whose value is an object, or an empty result when that object is cut off or
// there is none (lastObject).
func lastUsage(b []byte) gjson.Result { return lastObject(b, "usage") }

// lastObject is the value of the last key named key in b whose value is an object, or an
// empty result when that object is cut off or there is none (lastKey).
func lastObject(b []byte, key string) gjson.Result {
	if r := lastKey(b, key, '{'); r.IsObject() && validJSON([]byte(r.Raw)) {
		return r
	}
	return gjson.Result{}
}

// lastKey is the value of the last key named key in b whose value opens with open ('{' an
// object, '"' a string), read as the first key of an object so that it ends where its JSON
// does, or an empty result when there is none. Linear in b: only the last such key is read (a
// whole answer's report is its last), and a match that is not a key (a value, text quoting the
// word) costs a few byte compares. Parsing from every occurrence, each from a copy of the rest
// of b, took 8 s of CPU on a 512 KiB tail of `"usage",`.
func lastKey(b []byte, key string, open byte) gjson.Result {
	quoted := []byte(`"` + key + `"`)
	skip := func(i int) int {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
		return i
	}
	for end := len(b); end > 0; {
		i := bytes.LastIndex(b[:end], quoted)
		if i < 0 {
			return gjson.Result{}
		}
		end = i
		if i > 0 && b[i-1] == '\\' {
			continue // inside a string
		}
		j := skip(i + len(quoted))
		if j >= len(b) || b[j] != ':' {
			continue // a value, not a key
		}
		if j = skip(j + 1); j >= len(b) || b[j] != open {
			continue // null, or another kind of value
		}
		return gjson.GetBytes(append([]byte{'{'}, b[i:]...), key)
	}
	return gjson.Result{}
}
