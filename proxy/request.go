package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/internal/jsontop"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// route describes one model endpoint: how its usage is reported and how its body is rewritten.
type route struct {
	path         string // the same path is used upstream, after the upstream's base URL
	format       metering.Format
	upstreamKind string
	// maxFields are the body fields that bound output, in the order the gateway prefers to
	// lower them; the first is set when the caller set none and a bound is needed.
	maxFields []string
	// injectUsage: streams of this route report usage only when asked with
	// stream_options.include_usage.
	injectUsage bool
	// choiceFields ask for several answers (n, best_of), each up to the output bound.
	choiceFields []string
	// minBound is the least output bound the provider takes (0: 1): a cap that pays for
	// less is a budget too small for any answer.
	minBound int64
}

// leastBound is the least output bound the gateway may send on rt.
func (rt *route) leastBound() int64 { return max(1, rt.minBound) }

var routes = []*route{
	{path: "/v1/chat/completions", format: metering.FormatChat, upstreamKind: "openai",
		maxFields: []string{"max_tokens", "max_completion_tokens"}, injectUsage: true, choiceFields: []string{"n"}},
	{path: "/v1/completions", format: metering.FormatCompletions, upstreamKind: "openai",
		maxFields: []string{"max_tokens"}, injectUsage: true, choiceFields: []string{"n", "best_of"}},
	{path: "/v1/embeddings", format: metering.FormatEmbeddings, upstreamKind: "openai"},
	{path: "/v1/responses", format: metering.FormatResponses, upstreamKind: "openai",
		// OpenAI refuses max_output_tokens below 16 (integer_below_min_value).
		maxFields: []string{"max_output_tokens"}, minBound: 16},
	{path: anthropicPath, format: metering.FormatAnthropic, upstreamKind: "anthropic",
		maxFields: []string{"max_tokens"}},
}

// callRequest is a validated model request.
type callRequest struct {
	route    *route
	body     []byte // as it will be forwarded
	model    string
	stream   bool
	price    pricing.Price
	priceKey string // the configured model name that priced it
	upstream *config.Upstream
	// clientAskedUsage records whether the caller wanted the usage chunk; if not, the gateway
	// asked for it on its own behalf and removes it from what the caller sees.
	clientAskedUsage bool
	// inputEstimate guesses the prompt's tokens, audioEstimate the audio part of them (billed
	// at the audio price): they bound the output and stand in for a usage never reported.
	inputEstimate, audioEstimate int64
	// spoken: the call asks for an audio answer, whose every output token may be audio.
	spoken bool
	// cacheMarked: the body marks part of its prompt for the provider's cache (cache_control),
	// which the provider may then bill at the cache-write price; cacheLong: for an hour.
	cacheMarked, cacheLong bool
	// context1M: the call asks for Anthropic's 1M-context beta (asksContext1M), which bills a
	// prompt past 200 k at long-context rates.
	context1M bool
	// fallbackPrice is price made dearer by every model of a router's fallback list
	// (checkFallbacks), any of which may answer and be billed at its own price: the worst case
	// is reckoned at it (boundPrice). price itself when the call names no fallbacks.
	fallbackPrice pricing.Price
	// fallbacks: the call names a router's fallback list, so an answer that does not name its
	// model may be any of them (settlementAs bills it at fallbackPrice).
	fallbacks bool
	// fallbackLimits are the configured output limits of those fallbacks, any of which may
	// answer a call sent without a bound of its own at its own limit (addedBound).
	fallbackLimits outputLimits
	// previousResponse and conversation name what a Responses request carries on from on the
	// provider's side, whose context the provider bills as input though the body does not
	// hold it; carried is that context's tokens as recorded when those answers completed
	// (Server.carriedContext), a part of the prompt's estimate.
	previousResponse, conversation string
	carried                        int64
	// sentBack lists the earlier spoken answers a chat request sends back by their ids, each
	// counted in the estimates at metering.SentBackAnswerTokens until Server.hearAgain puts
	// its recorded length in its place.
	sentBack []string
	// spokenIDs are the distinct ids of every spoken answer it sends back, past sentBack's
	// bound too (at most maxSpokenIDsChecked): each one's owner is checked (Server.hearAgain).
	spokenIDs []string
	// itemIDs are the distinct ids of the items a Responses request's input names (an
	// item_reference, or an item sent back with its id), each one's owner checked before it is
	// forwarded (foreignItem).
	itemIDs   []string
	userTurns int
	maxOutput int64 // the caller's bound on output, -1 when it set none
	// bounds holds the value of each of route.maxFields, -1 where absent: a provider may
	// honour any of them, so the rewrite lowers every one that is over the limit.
	bounds []int64
	// choices is how many answers the call asks for (n, best_of, times the prompts of a
	// completions batch), each up to the bound.
	choices int64
	// echoPrompts are a completions call's prompts when it asks for them echoed (echo),
	// answered per prompt with echoPer choices (n): the echo is no output
	// (metering.Meter.EchoPrompts).
	echoPrompts []string
	echoPer     int64
	// batchPrompts is the estimate of each prompt of a completions batch of several, answered
	// per prompt with batchPer choices (n): a server that runs each prompt as a task reports
	// each task's prompt alone (metering.Meter.BatchPrompts).
	batchPrompts []int64
	batchPer     int64
}

// maxChoices bounds n and best_of (OpenAI allows n up to 128).
const maxChoices = 128

// readBody reads at most limit bytes; past it the request is refused with 413 before
// anything is held. A body that stops arriving for stall (at least half of it), or that
// arrives slower than minBodyRate on average once stall has passed, is refused with 408: the
// server sets no read timeout, and without this a caller could hold a connection and its body
// buffer for as long as it liked. The body counts against lease (bodyMemory) — all its
// Content-Length at once, before any of it is read, else as it is read — and one that does
// not fit is refused 503 or 429. A Content-Length over limit is refused 413 first, before
// anything is read: no caller is told to retry (429) what can never fit, nor told by a 100
// Continue to send a body that will be refused.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, stall time.Duration, lease *bodyLease) ([]byte, *apiError) {
	if r.ContentLength > limit {
		w.Header().Set("Connection", "close")
		return nil, errBodyTooLarge(limit)
	}
	if r.ContentLength > 0 {
		if err := lease.reserve(r.ContentLength); err != nil {
			w.Header().Set("Connection", "close")
			return nil, bodyMemoryError(err)
		}
	}
	rc := http.NewResponseController(w)
	sr := &stallReader{r: lease.reader(http.MaxBytesReader(nil, r.Body, limit)), rc: rc, timeout: stall}
	body, err := io.ReadAll(sr)
	// Lifted at once: a deadline left on the connection would end the server's background
	// read, which cancels the request's context, in the middle of the call.
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		// What is left of the body is not read: without this the server would drain it
		// (up to 256 KiB, with no deadline) before sending the answer, and a caller that
		// stalls there, even past the size limit, would hold the connection for good.
		w.Header().Set("Connection", "close")
	}
	if aerr := bodyMemoryError(err); aerr != nil {
		return nil, aerr
	}
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, errBodyTooLarge(limit)
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
			Message: "The request body stopped arriving."}
	}
	if err != nil {
		return nil, errBadRequest("unreadable_body", "Could not read the request body: "+err.Error())
	}
	return body, nil
}

func errBodyTooLarge(limit int64) *apiError {
	return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: fmt.Sprintf("Request body is larger than the limit of %d bytes.", limit)}
}

// checkContentEncoding refuses a body sent compressed (Content-Encoding other than identity):
// the gateway reads, meters and forwards the body as it arrives, so a compressed one would be
// refused as invalid JSON, and a plain one under such a label would reach the upstream with a
// header telling it to decompress what the gateway metered as plain.
func checkContentEncoding(h http.Header) *apiError {
	if ce, ok := httpapi.ContentEncoding(h); ok {
		return &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_content_encoding",
			Message: fmt.Sprintf("Request bodies sent with Content-Encoding %q are not supported; send the JSON uncompressed.", quotedValue(ce))}
	}
	return nil
}

// answerShapingQuery are Google's system parameters that reshape an answer, read from the query
// string (with or without a leading '$') by Google's front end on every API it serves, the
// Gemini OpenAI-compatible endpoint among them, and forwarded with the rest of the query: a
// field mask ("fields") can leave usage out of the answer, charged then at the prompt's estimate
// alone; "alt=proto" answers in protobuf and "callback" in JSONP, neither of which is JSON or an
// event stream: no answer the gateway can meter, charged nothing while the provider billed it.
var answerShapingQuery = []string{"fields", "alt", "callback"}

// modelQuery is the query parameter LiteLLM's proxy reads a model from on its chat, completions
// and embeddings routes (a query parameter of their handlers, there for its Azure-style
// deployment paths), in place of the body's: the router ran, and billed, the model the query
// named, while the gateway priced, bounded and charged the call as the body's model (an answer
// naming a model without a price is billed at the price asked for).
const modelQuery = "model"

// checkQuery refuses a query string carrying one of answerShapingQuery, or modelQuery, its
// name compared unescaped and with case folded. A ';' separates parameters as '&' does: servers
// that split on it (as Go's own did before 1.17) would read `?x=1;fields=choices` as a field
// mask.
func checkQuery(rawQuery string) *apiError {
	for pair := range strings.FieldsFuncSeq(rawQuery, isQuerySeparator) { // no slice built per request
		name, _, _ := strings.Cut(pair, "=")
		if unescaped, err := url.QueryUnescape(name); err == nil {
			name = unescaped
		}
		name = strings.TrimPrefix(strings.TrimSpace(name), "$")
		if strings.EqualFold(name, modelQuery) {
			return errBadRequest("unsupported_parameter",
				"The query parameter 'model' names a model a router in front of the provider runs in place of the body's, billed at its own rates while this gateway prices the body's; name the model in the body alone.")
		}
		for _, p := range answerShapingQuery {
			if strings.EqualFold(name, p) {
				return errBadRequest("unsupported_parameter", fmt.Sprintf(
					"The query parameter '%s' reshapes the provider's answer so that its usage cannot be metered; send the request without it.", p))
			}
		}
	}
	return nil
}

// isQuerySeparator reports whether r separates a query's parameters for some server.
func isQuerySeparator(r rune) bool { return r == '&' || r == ';' }

// stallReader moves the connection's read deadline forward as the body arrives, only once
// half of it has passed (each move resets a runtime timer): a read fails after between half
// the timeout and the whole of it without progress.
type stallReader struct {
	r       io.Reader
	rc      *http.ResponseController
	timeout time.Duration
	start   time.Time // the first Read
	read    int64
	// deadline is the read deadline set on the connection, zero before the first Read.
	deadline time.Time
}

// minBodyRate is the slowest a body may arrive, on average, once its first stall window has
// passed: a caller that trickles a byte now and then never stalls, and held a connection, its
// goroutine and a growing buffer for as long as it liked. At this pace the largest body allowed
// takes limits.max_body_bytes / 1 KiB seconds (an hour for 4 MiB), a bound however it is sent.
const minBodyRate = 1 << 10 // bytes per second

func (s *stallReader) Read(p []byte) (int, error) {
	if now := time.Now(); s.timeout > 0 && s.deadline.Sub(now) < s.timeout/2 {
		if s.start.IsZero() {
			s.start = now
		}
		// Moved only when less than half the window is left, so a body that arrives at pace
		// costs a deadline every half window, not one a Read.
		d := now.Add(s.timeout)
		if byRate := s.start.Add(s.timeout + time.Duration(s.read)*(time.Second/minBodyRate)); byRate.Before(d) {
			d = byRate // in the past when the body is already behind: the Read fails at once
		}
		_ = s.rc.SetReadDeadline(d)
		s.deadline = d
	}
	n, err := s.r.Read(p)
	s.read += int64(n)
	return n, err
}

// parseCall validates a body for rt. Everything a request can get wrong is found here, before
// a hold exists.
func (s *Server) parseCall(rt *route, body []byte, header http.Header) (*callRequest, *apiError) {
	parsed, aerr := parseObject(body)
	if aerr != nil {
		return nil, aerr
	}
	root := indexTop(parsed) // read many times below, mostly for keys the body lacks
	if aerr := checkReadKeysOnce(root); aerr != nil {
		return nil, aerr
	}
	m, aerr := s.servedModel(parsed, rt.path, rt.upstreamKind)
	if aerr != nil {
		return nil, aerr
	}
	c := &callRequest{route: rt, body: body, model: m.name, price: m.price, fallbackPrice: m.price, priceKey: m.priceKey,
		upstream: m.upstream, maxOutput: -1}
	if aerr := c.readAnswerOptions(root); aerr != nil {
		return nil, aerr
	}
	if aerr := c.readPrompt(root); aerr != nil {
		return nil, aerr
	}
	if aerr := s.checkOptions(c, root, header); aerr != nil {
		return nil, aerr
	}
	c.clientAskedUsage = root.Get("stream_options.include_usage").Type == gjson.True
	c.userTurns = metering.UserTurns(rt.format, body)
	if aerr := checkRepeatsAnywhere(rt.format, root); aerr != nil {
		return nil, aerr
	}
	return c, nil
}

// readAnswerOptions reads how the body asks to be answered: streamed or whole, up to which
// output bound, and how many answers; a background response, which cannot be metered, is
// refused.
func (c *callRequest) readAnswerOptions(root topObject) *apiError {
	rt := c.route
	// A null stream is the default, false, as OpenAI's API reads it (and as a null output
	// bound or n is read here): clients that write every optional field send it.
	if st := root.Get("stream"); st.Exists() && st.Type != gjson.Null {
		if st.Type != gjson.True && st.Type != gjson.False {
			return errBadRequest("invalid_stream", "'stream' must be a boolean.")
		}
		c.stream = st.Type == gjson.True
	}
	if aerr := c.readOutputBounds(root); aerr != nil {
		return aerr
	}
	var aerr *apiError
	if c.choices, aerr = readChoices(rt, root); aerr != nil {
		return aerr
	}
	if rt.format == metering.FormatCompletions {
		// Each prompt of a batch gets its own answers, each up to the bound.
		prompt, perPrompt := root.Get("prompt"), int64(1)
		prompts := promptCount(prompt)
		c.choices *= prompts
		if n := root.Get("n"); n.Type == gjson.Number {
			perPrompt = max(1, n.Int())
		}
		if prompts > 1 {
			c.batchPrompts, c.batchPer = metering.PromptEstimates(prompt), perPrompt
		}
		echo := root.Get("echo")
		if echo.Exists() && echo.Type != gjson.Null && echo.Type != gjson.True && echo.Type != gjson.False {
			// Servers built on pydantic (vLLM's) read "true" and 1 as true and echo the
			// prompt; read here as no echo, the echoed prompt was charged as output, at the
			// output price, when no usage came.
			return errBadRequest("invalid_echo", "'echo' must be a boolean.")
		}
		if echo.Type == gjson.True {
			c.echoPrompts, c.echoPer = echoedPrompts(prompt), perPrompt
		}
	}
	if bg := root.Get("background"); rt.format == metering.FormatResponses && bg.Exists() && bg.Type != gjson.Null && bg.Type != gjson.False {
		// A background response answers at once with a queued response and no usage; the
		// output, and what it cost, are fetched later from an endpoint the gateway does not
		// meter. Served, it would be charged the prompt's estimate for any amount of output.
		// Anything but false or null: servers built on pydantic (vLLM's) read "true" and 1 as
		// true.
		return errBadRequest("unsupported_parameter", "'background' responses are not supported: their usage cannot be metered.")
	}
	return nil
}

// readPrompt reads what the prompt will be billed as: its estimate, the spoken answers it
// sends back, what it carries on from at the provider, and the part it marks for the cache.
func (c *callRequest) readPrompt(root topObject) *apiError {
	rt, body := c.route, c.body
	c.inputEstimate, c.audioEstimate = metering.EstimatePrompt(rt.format, body)
	c.spoken = asksSpokenAnswer(rt.format, root)
	if rt.format == metering.FormatChat && c.audioEstimate > 0 {
		c.sentBack = metering.SpokenAnswersSentBack(body)
		var more bool
		if c.spokenIDs, more = metering.SpokenAnswerIDs(body, maxSpokenIDsChecked); more {
			return errBadRequest("too_many_audio_ids", fmt.Sprintf(
				"A request may send back at most %d distinct earlier spoken answers ({\"audio\": {\"id\": ...}}).", maxSpokenIDsChecked))
		}
	}
	if rt.format == metering.FormatResponses {
		c.previousResponse, c.conversation = continuedFrom(root)
		var more bool
		if c.itemIDs, more = metering.InputItemIDs(body, maxItemIDsChecked); more {
			return errBadRequest("too_many_item_ids", fmt.Sprintf(
				"A request's input may name at most %d distinct items by their ids (an item_reference, or an item sent back with its id).", maxItemIDsChecked))
		}
	}
	c.cacheMarked, c.cacheLong = cacheControls(root.Raw)
	return nil
}

// checkOptions refuses what the gateway could not bill or forward as asked: an option billed
// at rates it has no price for, an unpriced fallback model, a message without its required
// bound, stream options it could not edit.
func (s *Server) checkOptions(c *callRequest, root topObject, header http.Header) *apiError {
	rt := c.route
	if f := routerRetryField(root); f != "" {
		return errBadRequest("unsupported_parameter", fmt.Sprintf(
			"'%s' asks a router in front of the provider to time out, retry or fall back on its own, which this gateway cannot meter (a call the router gives up on after the provider had it is billed there and charged nothing here; one it runs several times is billed for each); send it without.", f))
	}
	if f := serverNativeField(root); f != "" {
		return errBadRequest("unsupported_parameter", fmt.Sprintf(
			"'%s' is an upstream server's own name for the output bound or the number of answers, read before 'max_tokens' and 'n', which bound what this gateway holds and charges; send those instead.", f))
	}
	if v := root.Get("tags"); v.Exists() && v.Type != gjson.Null {
		// LiteLLM's tag routing: the tags pick which of the router's deployments of the model
		// serves the call (its documented example routes "free" and "paid" to different
		// models under one name), as the x-litellm-tags header the gateway drops would.
		return errBadRequest("unsupported_parameter",
			"'tags' picks which of a router's deployments serves the call, which this gateway bills at one price for the model named; send it without.")
	}
	c.context1M = asksContext1M(header, root)
	if what := unpricedOption(rt.format, root, header, c.price, c.audioEstimate, c.cacheLong); what != "" {
		return errBadRequest("unpriced_option", fmt.Sprintf(
			"%s is billed by the provider at rates this gateway has no price for, so the request is refused; send it without.", what))
	}
	var aerr *apiError
	unpriced := func(p pricing.Price) string {
		return unpricedWork(rt.format, root, header, p, c.audioEstimate, c.cacheLong)
	}
	for _, field := range fallbackLists {
		list := root.Get(field)
		if c.fallbackPrice, aerr = s.checkFallbacks(field, list, c.fallbackPrice, &c.fallbackLimits, unpriced); aerr != nil {
			return aerr
		}
		c.fallbacks = c.fallbacks || list.IsArray() && list.Get("#").Int() > 0
	}
	if rt.format == metering.FormatAnthropic && c.maxOutput < 0 {
		return errBadRequest("missing_max_tokens", "'max_tokens' is required on /v1/messages.")
	}
	if so := root.Get("stream_options"); rt.injectUsage && so.Exists() && so.Type != gjson.Null && !so.IsObject() {
		// Found here, not when the rewrite fails to edit it: by then the call holds credits
		// and may have replaced its session's running call.
		return errBadRequest("invalid_stream_options", "'stream_options' must be an object.")
	}
	return nil
}

// checkRepeatsAnywhere refuses a body that repeats a key anywhere: below the top level, as at
// it (checkReadKeysOnce), what the prompt's estimate reads (the charge of a call whose usage
// never comes, the output bound within the cap) must be what the provider bills. Checked last,
// so that a body refused for what a repeat hid (an option billed at other rates) is told so.
func checkRepeatsAnywhere(format metering.Format, root topObject) *apiError {
	if k, ok := repeatedKeyAnywhere(root.Raw); ok {
		return errBadRequest("invalid_json", fmt.Sprintf("The request body repeats the key %q.", quotedValue(k)))
	}
	if k := repeatedPromptKey(format, root); k != "" {
		return errRepeatedKey(k)
	}
	return nil
}

// readKeys are the top-level keys parseCall reads, across every route: the model and stream
// mode, the output bounds, the options billed at other rates (unpricedOption: service_tier,
// Anthropic's premium "speed" and "inference_geo", Bedrock's "performanceConfig" and
// "serviceTier" as LiteLLM passes them on, audio, hosted tools), a router's fallback
// lists ("models", LiteLLM's "fallbacks": checkFallbacks) and provider preferences ("provider":
// routerProviderSort), "prompt", whose batch multiplies a
// completions call's answers, and every part of the prompt its estimate reads
// (metering.EstimatePrompt): "messages" and "input", a system prompt, instructions, an output
// schema, legacy function definitions, a completion's suffix. Under "messages" and "input" the
// audio refusal also looks for input_audio parts, and one in another case alone would carry
// them past it to a provider that folds keys.
//
// The keys read to refuse a call (unpricedOption, routerRetryField, serverNativeField) are among
// them: OpenRouter's "plugins", Vercel's "providerOptions", the body's "context-1m" beta,
// LiteLLM's timeouts and retries and its "extra_body", llama.cpp's "n_predict". Spelt in
// another case, a provider or relay that folds keys ran what the gateway, reading the exact
// spelling, never refused ("Plugins": a web search charged as tokens alone).
var readKeys = append(append([]string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens",
	"n", "best_of", "background", "service_tier", "web_search_options", "audio", "modalities", "tools", "messages", "input",
	"previous_response_id", "conversation", "prompt", "speed", "inference_geo", "models",
	"system", "instructions", "response_format", "text", "functions", "suffix", "fallbacks", "provider",
	"plugins", "providerOptions", "anthropic_beta", "additionalModelRequestFields", "tags",
	"performanceConfig", "serviceTier", "preset", "extra_body"}, routerRetryFields...), serverNativeFields...)

// nestedReadKeys are the keys the gateway reads inside a top-level object, checked as readKeys
// are.
var nestedReadKeys = []struct{ parent, key string }{
	{"stream_options", "include_usage"},                // whether the usage comes
	{"text", "format"},                                 // the Responses output schema, part of the prompt's estimate
	{"prompt", "variables"},                            // a stored prompt's variables, part of the prompt's estimate
	{"conversation", "id"},                             // the conversation whose context the estimate counts (continuedFrom)
	{"provider", "sort"},                               // a router's provider order, refused unless by price (routerProviderSort)
	{"providerOptions", "gateway"},                     // Vercel's fallback list and provider order
	{"additionalModelRequestFields", "anthropic_beta"}, // the context-1m beta, as Bedrock's Converse takes it
	{"providerOptions.gateway", "speed"},               // Vercel's fast mode (unpricedOption)
	{"performanceConfig", "latency"},                   // Bedrock's latency-optimized inference, through LiteLLM
	{"serviceTier", "type"},                            // Bedrock's service tier, through LiteLLM
}

// checkReadKeysOnce refuses a body that repeats a key the gateway reads at its top level
// (readKeys) or inside one of its objects (nestedReadKeys). The gateway reads the first of
// repeated keys (gjson), providers the last: a body that names one model, stream mode, output
// bound or usage option to the gateway and another to the provider would be billed for what
// it did not run.
func checkReadKeysOnce(root topObject) *apiError {
	if k, ok := repeatedKey(root.Result, readKeys...); ok {
		return errRepeatedKey(k)
	}
	for _, n := range nestedReadKeys {
		if obj := root.Get(n.parent); obj.IsObject() {
			if k, ok := repeatedKey(obj, n.key); ok {
				return errRepeatedKey(n.parent + "." + k)
			}
		}
	}
	return nil
}

// errRepeatedKey refuses a body whose key k, with case folded, repeats a key or spells one the
// gateway reads (repeatedKey, repeatedPromptKey): one wording for a call and a token count.
func errRepeatedKey(k string) *apiError {
	return errBadRequest("invalid_json", fmt.Sprintf("The request body repeats the key %q (keys are compared with case folded).", quotedValue(k)))
}

// readOutputBounds reads every output bound the route knows (max_tokens and its kin): each
// one the body carries, and the least of them as maxOutput, since providers differ in which
// they honour.
func (c *callRequest) readOutputBounds(root topObject) *apiError {
	c.bounds = make([]int64, len(c.route.maxFields))
	for i, f := range c.route.maxFields {
		c.bounds[i] = -1
		v := root.Get(f)
		if !v.Exists() || v.Type == gjson.Null {
			continue
		}
		// A bound of 0 is refused too: OpenAI, Anthropic and vLLM refuse it themselves, and
		// some upstreams read it as no bound at all (Ollama's num_predict), which the worst
		// case, at no output, would never have paid for.
		n, err := strconv.ParseInt(v.Raw, 10, 64)
		if v.Type != gjson.Number || err != nil || n < 1 {
			return errBadRequest("invalid_"+f, fmt.Sprintf("'%s' must be a positive integer.", f))
		}
		c.bounds[i] = n
		if c.maxOutput < 0 || n < c.maxOutput {
			c.maxOutput = n
		}
	}
	return nil
}

// readChoices reads how many answers the body asks for (n, best_of): the most of them, each
// answer up to the output bound.
func readChoices(rt *route, root topObject) (int64, *apiError) {
	choices := int64(1)
	for _, f := range rt.choiceFields {
		v := root.Get(f)
		if !v.Exists() || v.Type == gjson.Null {
			continue
		}
		n, err := strconv.ParseInt(v.Raw, 10, 64)
		if v.Type != gjson.Number || err != nil || n < 1 || n > maxChoices {
			return 0, errBadRequest("invalid_"+f, fmt.Sprintf("'%s' must be an integer from 1 to %d.", f, maxChoices))
		}
		choices = max(choices, n)
	}
	return choices, nil
}

// parseObject reads body as a JSON object, or refuses it.
func parseObject(body []byte) (gjson.Result, *apiError) {
	// Before gjson: its validation descends recursively, so a body of a few MiB of '[' would
	// grow one goroutine's stack to hundreds of MiB.
	if nestedDeeperThan(body, maxJSONDepth) {
		return gjson.Result{}, errBadRequest("invalid_json", fmt.Sprintf("The request body nests JSON deeper than %d levels.", maxJSONDepth))
	}
	if !gjson.ValidBytes(body) {
		return gjson.Result{}, errBadRequest("invalid_json", "The request body is not valid JSON.")
	}
	// Viewed, not copied (ParseBytes copied the whole body, a second one alive for as long as
	// anything read from it): the body is never edited in place.
	root := gjson.Parse(jsontop.View(body))
	if !root.IsObject() {
		return gjson.Result{}, errBadRequest("invalid_json", "The request body must be a JSON object.")
	}
	return root, nil
}

// servedModel is a request's model with its price and the upstream that serves it.
type servedModel struct {
	name     string
	price    pricing.Price
	priceKey string // the configured model name that priced it
	upstream *config.Upstream
}

// servedModel reads the model root names and finds its price and an upstream of kind that
// serves it on path, or refuses the request.
func (s *Server) servedModel(root gjson.Result, path, kind string) (servedModel, *apiError) {
	m := root.Get("model")
	if m.Type != gjson.String || m.Str == "" {
		return servedModel{}, errBadRequest("missing_model", "The request must name a model, as a non-empty string.")
	}
	if e := checkModelName(m.Str); e != nil {
		return servedModel{}, e
	}
	// m.Str is a window into the whole body: kept as the call's model (in its admission,
	// settlement and log), it would keep the body alive for as long as the call's deferred
	// work runs.
	sm := servedModel{name: strings.Clone(m.Str)}
	price, key, err := s.prices.Lookup(sm.name)
	if err != nil {
		return servedModel{}, errBadRequest("model_not_priced", fmt.Sprintf("Model %q has no price configured, so it cannot be billed.", sm.name))
	}
	if premiumVariant(sm.name, key) != "" {
		return servedModel{}, errPremiumVariant("model", sm.name, key)
	}
	sm.price, sm.priceKey = price, key
	up, ok := s.cfg.UpstreamFor(sm.name)
	if !ok || up.Kind != kind {
		return servedModel{}, errBadRequest("model_not_served", fmt.Sprintf("No configured upstream serves model %q on %s.", sm.name, path))
	}
	sm.upstream = up
	return sm, nil
}

// premiumVariant describes the variant of the model priced by the configured prefix key that
// name names, when the variant bills otherwise than the prefix's token prices, or returns "":
// a search variant (gpt-4o-search-preview under gpt-4o, gpt-5-search-api under gpt-5), which
// searches the web on every call, at a fee per search beside the tokens; a fast variant (a
// router's fast slug: OpenRouter's anthropic/claude-opus-4.6-fast, Vercel AI Gateway's
// anthropic/claude-opus-5-fast), the same model in the provider's fast mode, billed at a
// multiple of its rates (2–6×). The prefix's token prices would leave the difference to the
// operator. Such a model priced by its own name is the operator's choice, and served.
func premiumVariant(name, key string) string {
	if len(name) <= len(key) {
		return ""
	}
	switch rest := strings.ToLower(name[len(key):]); {
	case strings.Contains(rest, "search"):
		return "a search model that bills a fee per search"
	case strings.Contains(rest, "fast"):
		return "a fast variant billed at a multiple of the model's rates"
	}
	return ""
}

// errPremiumVariant refuses a premium variant (premiumVariant) named in field.
func errPremiumVariant(field, name, key string) *apiError {
	return errBadRequest("unpriced_option", fmt.Sprintf(
		"'%s' names %q, %s, priced here only by the prefix %q, whose token prices do not hold it; so the request is refused.", field, quotedValue(name), premiumVariant(name, key), key))
}

// checkModelName refuses a model name no call can be billed under, whatever prices it: one
// too long for the hold's column, not UTF-8, or a router's fallback chain. GET /v1/models/{id}
// answers 404 for the same names.
func checkModelName(name string) *apiError {
	if len(name) > holds.MaxModelLen {
		// Prices match by prefix, so a long name can be priced; it cannot be stored.
		return errBadRequest("model_too_long", fmt.Sprintf("A model name is at most %d bytes.", holds.MaxModelLen))
	}
	if !utf8.ValidString(name) {
		// The body's bytes are not checked as text (gjson does not), and a name priced by its
		// prefix could otherwise reach the hold's utf8mb4 column, which refuses it.
		return errBadRequest("invalid_model", "A model name must be UTF-8 text.")
	}
	if strings.Contains(name, ",") {
		// Helicone's gateway reads "cheap,dear" as a chain of models it falls back along,
		// each at its own rates; priced by its prefix, the name would be billed as the first.
		return errBadRequest("invalid_model", fmt.Sprintf(
			"Model %q names several models (a router's fallback chain); name one, and its fallbacks in 'models'.", name))
	}
	return nil
}

// maxFallbacks bounds a router's fallback list (checkFallbacks looks each name up): routers
// take a few (OpenRouter's documentation shows two or three).
const maxFallbacks = 64

// fallbackLists are the body fields in which a router takes a list of models to answer with
// when the one asked for fails: OpenRouter's "models", LiteLLM's "fallbacks" (whose proxy also
// takes "mock_testing_fallbacks": true, to use it at once), Vercel AI Gateway's
// "providerOptions.gateway.models".
var fallbackLists = []string{"models", "fallbacks", "providerOptions.gateway.models"}

// checkFallbacks refuses a router's list of fallback models (one of fallbackLists, named by
// field) that names a model without a price. The router answers with the first model of the
// list that is up, at that model's rates, and an answering model without a price is billed at
// the price asked for: a caller could ask a cheap model and fall back to a dear one. A list of
// priced models is served: the answer names the model that answered, and is billed at its
// price. It returns price (the asked model's, made dearer by the lists checked before) made
// dearer by every fallback's price, which the call's worst case is reckoned at: reckoned at the
// asked model's alone, a dearer fallback's answer could cost several times the cap, and what
// passed the cap went unpaid. Each fallback's output limit goes into limits, for the same
// reason: a fallback that may write more than the model asked for is bounded too (addedBound).
// A fallback without a price for work the call asks for (unpriced names it: the context-1m
// beta, audio in or out, one-hour cache writes) is refused as the model asked for would be:
// answering, it would bill that work at its text, short or five-minute rates, the provider
// charging its own.
//
// LiteLLM's list may also hold objects, a model with messages of its own: a prompt the
// estimate does not read, so refused too.
func (s *Server) checkFallbacks(field string, models gjson.Result, price pricing.Price, limits *outputLimits,
	unpriced func(pricing.Price) string) (pricing.Price, *apiError) {
	if !models.Exists() || models.Type == gjson.Null {
		return price, nil
	}
	notNames := errBadRequest("invalid_models", fmt.Sprintf("'%s' must be a list of model names.", field))
	if !models.IsArray() {
		return price, notNames
	}
	var aerr *apiError
	n, dearest := 0, price
	models.ForEach(func(_, m gjson.Result) bool {
		if n++; n > maxFallbacks {
			aerr = errBadRequest("invalid_models", fmt.Sprintf("'%s' names at most %d models.", field, maxFallbacks))
			return false
		}
		if m.Type != gjson.String || strings.Contains(m.Str, ",") { // a chain of several (servedModel)
			aerr = notNames
			return false
		}
		p, key, err := s.prices.Lookup(m.Str)
		if err != nil {
			aerr = errBadRequest("unpriced_option", fmt.Sprintf(
				"'%s' names %q, which has no price configured: a router answering with it would bill at its own rates, so the request is refused; send it without.", field, quotedValue(m.Str)))
			return false
		}
		if premiumVariant(m.Str, key) != "" {
			aerr = errPremiumVariant(field, m.Str, key)
			return false
		}
		if what := unpriced(p); what != "" {
			aerr = errBadRequest("unpriced_option", fmt.Sprintf(
				"'%s' names %q, which has no price for %s: answering, it would be billed at rates this gateway has no price for, so the request is refused; send it without.", field, quotedValue(m.Str), what))
			return false
		}
		dearest = dearest.Dearest(p)
		limits.add(s.cfg.Models[key].MaxOutputTokens)
		return true
	})
	return dearest, aerr
}

// outputLimits gathers the configured output limits of a call's fallback models.
type outputLimits struct {
	most, least int64 // the largest and the smallest known limit, 0 when none is known
	unknown     bool  // a fallback has no configured limit: it may write any length
}

// add counts one fallback's limit (0: unknown).
func (l *outputLimits) add(limit int64) {
	if limit <= 0 {
		l.unknown = true
		return
	}
	l.most = max(l.most, limit)
	if l.least == 0 || limit < l.least {
		l.least = limit
	}
}

// promptCount is how many prompts a completions request's prompt holds: an array of strings
// or of token arrays is a batch, answered prompt by prompt; a string, or one token array (an
// array of numbers), is one prompt. So is an array of both strings and numbers: llama.cpp's
// server reads it as one prompt, token ids with text between them, and runs it as one task
// whose report counts all of it (tokenize_input_prompts, "string or mixed"); read as a batch,
// its elements but the first were charged again at their estimates (Meter.BatchPrompts).
// OpenAI's API and vLLM refuse such a prompt.
func promptCount(prompt gjson.Result) int64 {
	if !prompt.IsArray() {
		return 1
	}
	var n int64
	tokens, numbers, text := true, false, false
	prompt.ForEach(func(_, v gjson.Result) bool {
		n++
		tokens = tokens && v.Type == gjson.Number
		numbers = numbers || v.Type == gjson.Number
		text = text || v.Type == gjson.String
		return true
	})
	if tokens || n == 0 || numbers && text {
		return 1
	}
	return n
}

// echoedPrompts are the prompts a completions call's echo answers with, in the order
// promptCount counts them (copies: the meter keeps them while the call runs): "" for a token
// array, whose text is not known.
func echoedPrompts(prompt gjson.Result) []string {
	text := func(v gjson.Result) string {
		if v.Type == gjson.String {
			return strings.Clone(v.Str)
		}
		return ""
	}
	if !prompt.IsArray() {
		return []string{text(prompt)}
	}
	if promptCount(prompt) == 1 {
		return []string{text(prompt.Get("0"))}
	}
	var prompts []string
	prompt.ForEach(func(_, v gjson.Result) bool {
		prompts = append(prompts, text(v))
		return true
	})
	return prompts
}

// maxJSONDepth is the deepest nesting of objects and arrays a body may have: encoding/json's
// own limit, far beyond any real request (tool schemas included).
const maxJSONDepth = 10000

// nestedDeeperThan reports whether b opens more than limit objects or arrays at once, outside
// strings. It does not validate; it only bounds what the recursive validation will face.
func nestedDeeperThan(b []byte, limit int) bool {
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > limit {
				return true
			}
		case '}', ']':
			depth--
		}
	}
	return false
}

// repeatedKey returns a key that obj holds more than once, or one that is a misspelling of a
// key in read (the keys the gateway reads), and whether there is one: the key found may be
// "" (an empty key is a key; read as "no repeat", a repeated one hid every repeat after it, a
// second "model" among them). Keys are compared unescaped and with case
// folded as Go's encoding/json matches them to fields ("Model", "MODEL", "ſtream" with
// U+017F): a provider decoding with it reads "model" and "Model" as one key (the last), and
// "Stream" alone as "stream", which the gateway would not see.
func repeatedKey(obj gjson.Result, read ...string) (string, bool) {
	return repeatedKeyEach(obj.Raw, read, nil)
}

// repeatedKeyEach is repeatedKey on the raw JSON of an object that also hands each member it
// passed to each (nil: none), so that a caller reads the values it wants in the same pass.
// When no repeat is found, each has seen every member, and each key once: exact repeats too
// are repeats.
func repeatedKeyEach(raw string, read []string, each func(key, value string)) (string, bool) {
	var (
		few  [keysBeforeSet]string // the keys seen, until there are more
		n    int
		many map[string]struct{} // then their foldKey
		dup  string
	)
	found := false
	jsontop.Members(raw, func(k, v string) bool {
		if seenFolded(k, few[:n], many) {
			dup, found = k, true
			return false
		}
		for _, r := range read {
			if k != r && strings.EqualFold(k, r) {
				dup, found = k, true
				return false
			}
		}
		switch {
		case many != nil:
			many[foldKey(k)] = struct{}{}
		case n < len(few):
			few[n] = k
			n++
		default:
			many = make(map[string]struct{}, 2*keysBeforeSet)
			for _, s := range few {
				many[foldKey(s)] = struct{}{}
			}
			many[foldKey(k)] = struct{}{}
		}
		if each != nil {
			each(k, v)
		}
		return true
	})
	return dup, found
}

// seenFolded reports whether k, with case folded, is among the keys seen: in many once there
// is one, else in few.
func seenFolded(k string, few []string, many map[string]struct{}) bool {
	if many != nil {
		_, ok := many[foldKey(k)]
		return ok
	}
	for _, s := range few {
		if strings.EqualFold(s, k) {
			return true
		}
	}
	return false
}

// foldKey maps every rune of s to the smallest of its simple case folding orbit, so that
// foldKey(a) == foldKey(b) exactly when strings.EqualFold(a, b).
func foldKey(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		// Every ASCII letter's orbit has its upper case as smallest ('k' and 's' too: U+212A
		// and U+017F are larger).
		return strings.ToUpper(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		b.WriteRune(m)
	}
	return b.String()
}

// outputBound is the most output the call can produce as sent: none on a route without output
// (embeddings), its own limit, else the configured limit of the model asked for
// (modelMaxOutput, 0 when unknown) or of a fallback that may answer instead, if larger, else
// -1 for no known bound (the model's or a fallback's limit unknown).
func (c *callRequest) outputBound(modelMaxOutput int64) int64 {
	switch {
	case len(c.route.maxFields) == 0:
		return 0
	case c.maxOutput >= 0:
		return c.allAnswers(c.maxOutput)
	case modelMaxOutput > 0 && !c.fallbackLimits.unknown:
		return c.allAnswers(max(modelMaxOutput, c.fallbackLimits.most))
	}
	return -1
}

// addedBound is the output bound, per answer, that the gateway adds to a call sent without
// one, or 0 for none: needed when a model that may answer can write past limit, what the cap
// pays for — the model asked for, by its limit (modelMaxOutput), or a fallback, by a larger
// limit or an unknown one. Unbounded, a router's fallback wrote to its own limit, billed at its
// price, and what passed the cap went unpaid. The bound is limit, lowered to the least known
// limit of the models that may answer: above its limit a provider refuses the request. Only
// when the asked model's limit is known: a bound above it would make the provider refuse the
// request, so an unknown limit relies on the settlement's clamp to the cap.
func (c *callRequest) addedBound(modelMaxOutput, limit int64) int64 {
	fb := c.fallbackLimits
	if modelMaxOutput <= 0 || (modelMaxOutput <= limit && !fb.unknown && fb.most <= limit) {
		return 0
	}
	bound := min(limit, modelMaxOutput)
	if fb.least > 0 {
		bound = min(bound, fb.least)
	}
	return bound
}

// allAnswers is perAnswer output tokens for each of the call's answers, at most
// pricing.MaxTokens: a batch of prompts times n can be large enough to overflow the product.
func (c *callRequest) allAnswers(perAnswer int64) int64 {
	return min(perAnswer, pricing.MaxTokens/c.choices) * c.choices
}

// promptEstimate is the prompt's estimated usage: its tokens (with the context it carries on
// from an earlier answer or a conversation), the audio part priced apart.
// The audio estimate reads parts the prompt's does not (keys in another case): the prompt is
// at least its audio, as Clamp bills it, so that the tally (unclamped) records what the
// settlement's row does.
func (c *callRequest) promptEstimate() pricing.Usage {
	return pricing.Usage{Input: max(c.inputEstimate, c.audioEstimate) + c.carried, AudioInput: c.audioEstimate}
}

// maxContinuedID bounds a response or conversation id the gateway looks up: longer is no id.
const maxContinuedID = 256

// continuedFrom returns what a Responses request continues: its previous_response_id and its
// conversation (an id, or an object with one); "" for either it does not name.
func continuedFrom(root topObject) (previousResponse, conversation string) {
	id := func(v gjson.Result) string {
		if v.Type == gjson.String && len(v.Str) <= maxContinuedID {
			return v.Str
		}
		return ""
	}
	conv := root.Get("conversation")
	if conv.IsObject() {
		conv = conv.Get("id")
	}
	return id(root.Get("previous_response_id")), id(conv)
}

// continues lists the ids the call's prompt continues, for Server.carriedContext.
func (c *callRequest) continues() []string {
	var ids []string
	for _, id := range []string{c.previousResponse, c.conversation} {
		if id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// boundPrice is the price a worst case of the call is reckoned at: the dearest of the models
// that may answer it (fallbackPrice), every output token as audio when the call asks for an
// audio answer, every prompt token at the cache-write price when the call marks its prompt for
// the cache (the provider bills what it writes at that price, 1.25× or 2× the input price:
// reckoned at the input price, a call whose cap binds cost more than its cap). On the
// OpenAI-shaped routes that holds unmarked too: OpenAI caches a prompt unasked, and its newer
// models (gpt-5.6 on) bill what they write at a cache-write price dearer than the input price
// (input_tokens_details.cache_write_tokens); a model priced so has its prompt reckoned at it.
// (PromptWritten keeps the input price where the cache-write price is not dearer.)
func (c *callRequest) boundPrice() pricing.Price {
	p := c.fallbackPrice
	if c.spoken {
		p = p.Spoken()
	}
	if c.route.format != metering.FormatAnthropic && c.route.format != metering.FormatEmbeddings {
		p = p.PromptWritten(false)
	}
	return c.promptPrice(p)
}

// promptPrice is p with the prompt at the price the provider may bill it at: the cache-write
// price (the one-hour one for a ttl of 1h) when the call marks its prompt for the cache. Both
// the output bound and the estimate of a call without a usage report price the prompt so.
func (c *callRequest) promptPrice(p pricing.Price) pricing.Price {
	if c.cacheMarked {
		p = p.PromptWritten(c.cacheLong)
	}
	return p
}

// rewrite prepares the body for the upstream once the cap is known: it asks for the usage
// chunk, and lowers the output bound when the worst case would pass the cap. It edits the raw
// bytes with sjson, so every field the gateway does not know passes through untouched.
// It returns false when not even an empty answer fits in the cap. model is the configured
// model that priced the call: its own output limit, and the field a bound is added in.
func (c *callRequest) rewrite(capMicro int64, model config.ModelCfg) (bool, error) {
	var err error
	if c.stream && c.route.injectUsage && !c.clientAskedUsage {
		if c.body, err = sjson.SetBytes(c.body, "stream_options.include_usage", true); err != nil {
			return false, fmt.Errorf("set include_usage: %w", err)
		}
	}
	if len(c.route.maxFields) == 0 {
		// No output to bound (embeddings): the prompt alone must fit, as a chat call's must,
		// or the provider bills all of it and the charge is clamped to the cap.
		return c.boundPrice().Cost(c.promptEstimate()) <= capMicro, nil
	}
	limit := c.boundPrice().MaxOutputWithin(c.promptEstimate(), capMicro)
	if limit < 0 {
		return false, nil
	}
	// Each of the call's answers may use the bound.
	limit /= c.choices
	if c.maxOutput >= 0 {
		for i, f := range c.route.maxFields {
			if c.bounds[i] > limit {
				if limit < c.route.leastBound() {
					// A bound of 0 is refused by the providers (400 about a max_tokens the
					// caller never sent), as is one below a route's least: the budget pays for
					// no answer, which is 402.
					return false, nil
				}
				if c.body, err = sjson.SetBytes(c.body, f, limit); err != nil {
					return false, fmt.Errorf("lower output bound: %w", err)
				}
				if ok, err := c.fitThinking(limit); !ok || err != nil {
					return ok, err
				}
			}
		}
	} else if limit < c.route.leastBound() {
		// Whether or not a bound could be added (the model's own limit known), a budget that
		// pays for no answer is 402: forwarded unbounded, the answer would be served and its
		// cost clamped away at settlement, paid by the operator.
		return false, nil
	} else if bound := c.addedBound(model.MaxOutputTokens, limit); bound > 0 {
		field := c.route.maxFields[0]
		if c.route.format == metering.FormatChat && model.OutputBoundField != "" {
			field = model.OutputBoundField // a reasoning model refuses max_tokens
		}
		if c.body, err = sjson.SetBytes(c.body, field, bound); err != nil {
			return false, fmt.Errorf("add output bound: %w", err)
		}
	}
	return true, nil
}

// minThinkingBudget is Anthropic's least thinking.budget_tokens.
const minThinkingBudget = 1024

// fitThinking keeps an Anthropic extended-thinking request valid once max_tokens is lowered to
// limit: Anthropic refuses budget_tokens >= max_tokens. The thinking budget is lowered with
// it; a limit that leaves less than the least thinking budget is a budget too small (402).
func (c *callRequest) fitThinking(limit int64) (bool, error) {
	if c.route.format != metering.FormatAnthropic {
		return true, nil
	}
	root := gjson.GetBytes(c.body, "thinking")
	if root.Get("type").Str != "enabled" {
		return true, nil
	}
	bt := root.Get("budget_tokens")
	if bt.Type != gjson.Number || bt.Int() < limit {
		return true, nil
	}
	if limit-1 < minThinkingBudget {
		return false, nil
	}
	var err error
	if c.body, err = sjson.SetBytes(c.body, "thinking.budget_tokens", limit-1); err != nil {
		return false, fmt.Errorf("lower thinking budget: %w", err)
	}
	return true, nil
}

// topObject is a body's top level, indexed once for the many keys parseCall's checks read.
type topObject = jsontop.Object

var indexTop = jsontop.Index
