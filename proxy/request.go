package proxy

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
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

// maxBatchPrompts bounds the prompts of a completions batch: as many as OpenAI takes in one
// input array (embeddings'). Each prompt of a batch is kept apart for the call's life, read
// before anything is held, for any key: its estimate, its echo, its task in the meter (48
// bytes and more, against 3 bytes of body for each `"",`). Unbounded, a 4 MiB body of empty
// prompts allocated some 190 MiB as it was read and kept 40 MiB of it, uncounted by the
// body's bound on memory (bodyMemory), which a few callers' bodies could so pass tenfold.
const maxBatchPrompts = 2048

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
		if prompts > maxBatchPrompts {
			return errBadRequest("too_many_prompts", fmt.Sprintf("A completions request may send at most %d prompts in one batch.", maxBatchPrompts))
		}
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
	if f := routerHeaderField(root); f != "" {
		return errBadRequest("unsupported_parameter", fmt.Sprintf(
			"'%s' is sent by a router in front of the provider as the provider's request headers, past the headers this gateway keeps from it (ones that pick a dearer service tier or leave the usage out of the answer); send it without.", f))
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
	members := 0
	jsontop.Members(root.Raw, func(_, _ string) bool {
		members++
		return members <= maxTopMembers
	})
	if members > maxTopMembers {
		return gjson.Result{}, errBadRequest("invalid_json", fmt.Sprintf("The request body's top level has more than %d fields.", maxTopMembers))
	}
	return root, nil
}

// maxTopMembers bounds the fields of a body's top level, counted before they are indexed: an
// API's request has a few dozen. The top level is indexed by key more than once as it is read
// (indexTop, the prompt's estimate), some 100 bytes a member against a few of body for each
// `"k":0,`: a 4 MiB body of 400 000 short keys allocated some 350 MiB before anything was
// held, for any key, uncounted by the body's bound on memory (bodyMemory).
const maxTopMembers = 1024

// topObject is a body's top level, indexed once for the many keys parseCall's checks read.
type topObject = jsontop.Object

var indexTop = jsontop.Index
