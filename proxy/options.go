package proxy

import (
	"net/http"
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// unpricedOption names the first option of a request that makes the provider bill at rates a
// price list of input, cache and output tokens cannot express, or returns "". Forwarded, such
// a call would be charged at the model's token prices for work that costs more — a dearer
// service tier, a hosted tool's per-call fee, audio tokens at several times the text price —
// and the difference would fall on whoever pays the provider. Refused, the caller learns at
// once which option to drop, and nothing is held.
//
// audioTokens is the estimate of the prompt's audio (metering.EstimatePrompt): audio
// input on a model without an audio input price is refused likewise, as is a spoken answer on
// one without an audio output price.
func unpricedOption(format metering.Format, root topObject, header http.Header, price pricing.Price, audioTokens int64, longCache bool) string {
	if what := unpricedWork(format, root, header, price, audioTokens, longCache); what != "" {
		return what
	}
	for _, p := range root.Get("plugins").Array() {
		if pluginAmbiguous(p) {
			// As a tool's type (typeAmbiguous): the gateway would read one plugin, a
			// provider or relay that folds keys, or reads the last, another.
			return "a plugin whose 'id', 'pdf' or 'engine' is repeated or spelt in another case"
		}
	}
	if what := routerWebSearch(root); what != "" {
		return what
	}
	for _, p := range root.Get("plugins").Array() {
		// OpenRouter's PDF parsing with its "mistral-ocr" engine bills each page it reads.
		if strings.EqualFold(strings.TrimSpace(p.Get("id").Str), "file-parser") &&
			strings.EqualFold(strings.TrimSpace(p.Get("pdf.engine").Str), "mistral-ocr") {
			return "the router's 'file-parser' plugin with the 'mistral-ocr' engine (a per-page fee)"
		}
	}
	if routerModelNamed(root, ":nitro") {
		// OpenRouter's :nitro admits its providers' priority tier, billed at priority rates:
		// service_tier "priority" by another name.
		return "a model named with ':nitro' (the router may serve it at a provider's priority tier, billed at priority rates)"
	}
	if routerModelNamed(root, ":exacto") {
		// OpenRouter documents :exacto as a shortcut for its provider sort "exacto", which puts
		// providers by tool-calling quality before its price-weighted order (routerProviderSort).
		return "a model named with ':exacto' (the router sorts its providers by quality, not price, billed at the chosen provider's rates)"
	}
	if by := routerProviderSort(root); by != "" {
		// OpenRouter documents :nitro as exactly provider.sort "throughput": refused by one
		// spelling, the request was served by the other.
		return "'" + quotedValue(by) + "' (the router tries its fastest provider first, not its cheapest, billed at that provider's rates: ':nitro' by another name)"
	}
	if what := unpricedTier(format, root.Get("service_tier")); what != "" {
		return what
	}
	if what := premiumSpeed(root); what != "" {
		return what
	}
	if v := root.Get("preset"); v.Exists() && v.Type != gjson.Null {
		// Perplexity's Agent API presets (fast-search, pro-search, deep-research) bundle its
		// web_search and fetch_url tools, billed per call, with no tool in the request for the
		// hosted tools' check to read; the model asked for may still be set beside it, and is
		// what the call is priced at. OpenRouter's presets alike carry settings (plugins,
		// provider order) the gateway never sees.
		return "'preset' (the preset's tools, web_search and fetch_url, bill a fee per call)"
	}
	if v := root.Get("extra_body"); v.Exists() && v.Type != gjson.Null && !emptyObject(v) {
		// LiteLLM merges a body's extra_body into the provider's request (each key the request
		// does not set already), and hands the OpenAI SDK its extra_body, which the SDK merges
		// so: every option refused here at the top level (a service_tier, fast mode, a hosted
		// tool, a router's fallbacks) reached the provider from inside it, unread. The SDKs
		// send a caller's own extra_body merged into the body, never under that key.
		return "'extra_body' (a router such as LiteLLM merges its keys into the provider's request, where the gateway's checks do not read them)"
	}
	for _, tool := range root.Get("tools").Array() {
		if typeAmbiguous(tool) {
			// The gateway would read one type of tool and the provider run another.
			return "a tool whose 'type' is repeated"
		}
		// OpenRouter's server tools, on every route it serves: it runs them itself and bills
		// their fees (a search per result, an image at image rates) beside the tokens.
		if t := tool.Get("type").Str; strings.HasPrefix(strings.ToLower(strings.TrimSpace(t)), "openrouter:") {
			return "the router's server tool '" + quotedValue(t) + "' (a per-use fee)"
		}
		if k := geminiGroundingKey(tool); k != "" {
			return "Gemini's grounding tool '" + quotedValue(k) + "' (a fee per search or grounded prompt)"
		}
	}
	switch format {
	case metering.FormatChat:
		if v := root.Get("web_search_options"); v.Exists() && v.Type != gjson.Null {
			return "'web_search_options' (a per-search fee)"
		}
		// OpenRouter's chat route takes the hosted tools' OpenAI names (its web search), as do
		// Groq's and Mistral's chat routes theirs.
		if t := firstTool(root, hostedToolsWithFees...); t != "" {
			return "the hosted tool '" + quotedValue(t) + "' (a fee per call or result)"
		}
		// A router's or Gemini's image generation: the image's output tokens are billed at an
		// image rate many times the text output price (30 against 2.50 USD/M on Gemini 2.5
		// Flash Image), and the usage counts them in completion_tokens.
		for _, m := range root.Get("modalities").Array() {
			if strings.EqualFold(strings.TrimSpace(m.Str), "image") {
				return "an image answer ('modalities: image'; image output tokens, which the price list has no price for)"
			}
		}
	case metering.FormatResponses:
		if t := firstTool(root, hostedToolsWithFees...); t != "" {
			return "the hosted tool '" + quotedValue(t) + "' (a fee per call or result)"
		}
		if hostedShell(root) {
			return "the hosted 'shell' (an 'environment' other than 'local': a per-container fee)"
		}
	case metering.FormatAnthropic:
		if t := firstTool(root, "web_search", "code_execution"); t != "" {
			return "the server tool '" + quotedValue(t) + "' (a per-use fee)"
		}
		if t := firstTool(root, "advisor"); t != "" {
			// The advisor's tokens are billed at the advisor model's rates, a dearer model
			// than the one asked for and priced here.
			return "the server tool '" + quotedValue(t) + "' (the advisor model's rates)"
		}
	}
	return ""
}

// premiumSpeed names a request's ask for a faster or otherwise dearer way of serving the same
// model, on any route, or returns "":
//
//   - Anthropic's fast mode ("speed" other than "standard": a multiple of the standard rates)
//     and regional inference ("inference_geo" other than "global": 1.1× every token). On every
//     route: LiteLLM passes a parameter OpenAI has no name for straight into the provider's
//     body, so its chat route serving Claude runs them, and OpenRouter takes "speed": "fast"
//     for its Claude models' fast mode, as it takes service_tier "fast" (unpricedTier).
//   - Vercel AI Gateway's "providerOptions.gateway.speed" other than "standard": its unified
//     fast mode, which upgrades the model to its fast serving path, at the fast slug's price.
//   - Bedrock's Converse "performanceConfig" with a "latency" other than "standard"
//     (latency-optimized inference, at its own higher rates) and "serviceTier" other than
//     "default" (priority at a premium, flex at a discount, reserved at a capacity price),
//     which LiteLLM's Bedrock route takes from the body and sets on the Converse request.
func premiumSpeed(root topObject) string {
	if v := root.Get("speed"); v.Exists() && v.Type != gjson.Null && v.Str != "standard" {
		return "'speed: " + quotedValue(v.String()) + "' (fast mode's rates)"
	}
	if v := root.Get("inference_geo"); v.Exists() && v.Type != gjson.Null && v.Str != "global" {
		return "'inference_geo: " + quotedValue(v.String()) + "' (regional inference's rates)"
	}
	if v := root.Get("providerOptions.gateway.speed"); v.Exists() && v.Type != gjson.Null && v.Str != "standard" {
		return "'providerOptions.gateway.speed: " + quotedValue(v.String()) + "' (the router's fast mode, at the fast model's rates)"
	}
	if pc := root.Get("performanceConfig"); pc.Exists() && pc.Type != gjson.Null {
		if l := pc.Get("latency"); !pc.IsObject() || l.Exists() && l.Type != gjson.Null && l.Str != "standard" {
			return "'performanceConfig: " + quotedValue(pc.String()) + "' (Bedrock's latency-optimized inference, at its own rates)"
		}
	}
	if st := root.Get("serviceTier"); st.Exists() && st.Type != gjson.Null {
		tier := st
		if st.IsObject() {
			tier = st.Get("type")
		}
		if tier.Type != gjson.Null && tier.Str != "default" {
			return "'serviceTier: " + quotedValue(st.String()) + "' (Bedrock's service tier, off the standard rate)"
		}
	}
	return ""
}

// unpricedWork is the part of unpricedOption that depends on the model's price: work the call
// asks for that the provider bills at a price of its own — long-context rates, audio in or out,
// one-hour cache writes — which price may lack. Every model that may answer the call is held to
// it (checkFallbacks): a router's fallback without the price answers at its own rates for the
// work, and billed at its text, output or cache-write price instead, a call with audio paid a
// fraction of what the provider charged.
func unpricedWork(format metering.Format, root topObject, header http.Header, price pricing.Price, audioTokens int64, longCache bool) string {
	// Past 200 k prompt tokens the beta bills every token at long-context rates: served on a
	// model whose price has them (pricing.Price.Long), billed at them past its line.
	if asksContext1M(header, root) && price.Long == nil {
		return "the 'context-1m' beta (long-context rates, unpriced for this model)"
	}
	if audioTokens > 0 && price.AudioInput == 0 {
		return "audio input (an 'input_audio' part, or an earlier answer's 'audio' sent back; audio input tokens, unpriced for this model)"
	}
	if format == metering.FormatChat && asksSpokenAnswer(format, root) && price.AudioOutput == 0 {
		return "an audio answer ('audio', 'modalities: audio'; audio output tokens, unpriced for this model)"
	}
	// On every route: a router serving Claude on the OpenAI-shaped ones (OpenRouter, LiteLLM)
	// passes cache_control, its ttl included, on to Anthropic, which bills one-hour writes at
	// 2× the input price.
	if price.CacheWrite1h == 0 && longCache {
		return "'cache_control' with a 'ttl' other than 5m (one-hour cache writes, unpriced for this model)"
	}
	return ""
}

// asksContext1M reports whether a request asks for Anthropic's 1M-context beta, under which a
// prompt may pass the long-context line: every model that may answer it (a router's fallbacks
// too, checkFallbacks) must have a long-context price. On any route, the caller's headers being
// forwarded: a router serving Claude on the OpenAI routes passes the header on (LiteLLM does),
// and some read it under a prefixed name (LiteLLM's x-pass-anthropic-beta, OpenRouter's
// x-anthropic-beta): any name that ends in anthropic-beta counts, its values in any case. In
// the body too, where Bedrock takes it ("anthropic_beta", or in Converse's
// "additionalModelRequestFields") and a router serving Claude from Bedrock passes a field it
// does not know on: the gateway forwards such fields untouched.
func asksContext1M(header http.Header, root topObject) bool {
	for name, values := range header {
		if !strings.HasSuffix(strings.ToLower(name), "anthropic-beta") {
			continue
		}
		for _, v := range values {
			if strings.Contains(strings.ToLower(v), "context-1m") {
				return true
			}
		}
	}
	for _, path := range []string{"anthropic_beta", "additionalModelRequestFields.anthropic_beta"} {
		for _, b := range root.Get(path).Array() { // a list, or one string
			if b.Type == gjson.String && strings.Contains(strings.ToLower(b.Str), "context-1m") {
				return true
			}
		}
	}
	return false
}

// asksSpokenAnswer reports whether a request asks for an audio answer: a chat request with
// 'audio' options or "audio" among its 'modalities', read as the image modality is (case
// folded, spaces trimmed: a router or compatible server may read " Audio" so, and the provider
// that would refuse it loses the caller nothing). Either alone counts: the output bound of
// such a call prices every output token as audio (pricing.Price.Spoken).
func asksSpokenAnswer(format metering.Format, root topObject) bool {
	if format != metering.FormatChat {
		return false
	}
	if v := root.Get("audio"); v.Exists() && v.Type != gjson.Null {
		return true
	}
	for _, m := range root.Get("modalities").Array() {
		if strings.EqualFold(strings.TrimSpace(m.Str), "audio") {
			return true
		}
	}
	return false
}

// cacheControls reports whether any cache_control in the JSON raw (valid JSON: parseCall has
// checked), at any depth (system, messages, their content blocks, tools, the top level), marks
// the prompt for the cache (an object), and whether any asks for a ttl other than the default
// five minutes: the provider then bills the cache write at its one-hour rate. Keys and values
// are compared unescaped, as the provider reads them, and keys with case folded.
//
// One pass over the bytes. Walked level by level with gjson, each level's parse scans
// everything nested below it: a body of deeply nested brackets then costs time quadratic in
// its size (a 4 MiB one, about an hour of CPU), before anything is held (see maxContentDepth
// in metering for the same trap in the estimate).
func cacheControls(raw string) (marked, long bool) {
	type frame struct {
		object       bool
		cacheControl bool   // an object that is the value of a "cache_control" key
		wantKey      bool   // the next string is a key
		key          string // the key whose value comes next: "cache_control", "ttl" or ""
	}
	var stack []frame
	// asksHere reports whether a value starting now is a cache_control's ttl: every one but
	// the string "5m" and null asks for a longer cache.
	asksHere := func() bool {
		n := len(stack)
		return n > 0 && stack[n-1].cacheControl && stack[n-1].key == "ttl"
	}
	for i := 0; i < len(raw); i++ {
		switch ch := raw[i]; ch {
		case ' ', '\t', '\n', '\r', ':':
		case ',':
			if n := len(stack); n > 0 && stack[n-1].object {
				stack[n-1].wantKey = true
			}
		case '}', ']':
			stack = stack[:len(stack)-1]
		case '{', '[':
			if asksHere() {
				return true, true
			}
			n := len(stack)
			cc := ch == '{' && n > 0 && stack[n-1].object && stack[n-1].key == "cache_control"
			marked = marked || cc
			stack = append(stack, frame{object: ch == '{', cacheControl: cc, wantKey: ch == '{'})
		case '"':
			end, escaped := closingQuote(raw, i)
			str, quoted := raw[i+1:end], raw[i:end+1]
			i = end
			isKey := len(stack) > 0 && stack[len(stack)-1].wantKey
			if !isKey && !asksHere() {
				continue // a value no ttl: a prompt's text is not unescaped for nothing
			}
			if escaped {
				str = gjson.Parse(quoted).Str
			}
			if n := len(stack); isKey {
				stack[n-1].wantKey = false
				// With case folded, as Go's encoding/json matches keys to fields (repeatedKey):
				// a provider or relay decoding with it reads "TTL" as "ttl".
				switch {
				case strings.EqualFold(str, "cache_control"):
					stack[n-1].key = "cache_control"
				case strings.EqualFold(str, "ttl"):
					stack[n-1].key = "ttl"
				default:
					stack[n-1].key = ""
				}
				continue
			}
			if asksHere() && str != "5m" {
				return true, true
			}
		default: // a number, true, false or null
			end := i
			for end < len(raw) && !strings.ContainsRune(",:]} \t\n\r", rune(raw[end])) {
				end++
			}
			if asksHere() && raw[i:end] != "null" {
				return true, true
			}
			i = end - 1
		}
	}
	return marked, false
}

// hostedToolsWithFees are the tool types (by prefix) that a provider on an OpenAI-shaped
// route runs itself and bills per call, per search or per result beside the tokens, so that
// the token prices cannot carry them: OpenAI's hosted tools (web_search*, file_search,
// code_interpreter's container, image_generation at image rates), which routers (OpenRouter's
// web search) and Mistral's connectors take on the chat route too; xAI's server tools (x_search,
// code_execution, collections_search, attachment_search: 2.50–10 USD per thousand calls);
// Perplexity's (fetch_url, finance_search, people_search, image_search: per call); and Groq's
// browser_search (per search). Tools that cost tokens only (function, custom, mcp,
// computer_use_preview, local_shell, apply_patch) pass.
var hostedToolsWithFees = []string{"web_search", "file_search", "code_interpreter", "image_generation",
	"x_search", "code_execution", "collections_search", "attachment_search",
	"fetch_url", "finance_search", "people_search", "image_search", "browser_search"}

// geminiGroundingKey returns the key of a tools entry in Gemini's own shape that asks for
// grounding (googleSearch, google_search_retrieval, googleMaps, enterpriseWebSearch, in any
// case and either spelling), or "". Routers serving Gemini (LiteLLM) pass such an entry on as
// Gemini's grounding, billed per search query or grounded prompt (14–35 USD per thousand), and
// it has no type for the hosted tools' check to read.
func geminiGroundingKey(tool gjson.Result) string {
	found := ""
	tool.ForEach(func(k, _ gjson.Result) bool {
		switch strings.ReplaceAll(strings.ToLower(k.Str), "_", "") {
		case "googlesearch", "googlesearchretrieval", "googlemaps", "enterprisewebsearch":
			found = k.Str
			return false
		}
		return true
	})
	return found
}

// firstTool returns the type of the first entry of the request's tools whose type starts
// with one of families (types carry a version or variant: web_search_preview,
// web_search_20250305), or "".
func firstTool(root topObject, families ...string) string {
	for _, tool := range root.Get("tools").Array() {
		t := tool.Get("type").Str
		for _, f := range families {
			if strings.HasPrefix(t, f) {
				return t
			}
		}
	}
	return ""
}

// hostedShell reports whether a Responses request's tools hold a shell that runs in a
// container OpenAI provisions or the caller names ('environment' of type container_auto or
// container_reference): billed per container, as code_interpreter is. A shell without an
// environment, or with a local one, is run by the caller and costs tokens only; any other
// environment counts as hosted, so a new kind is not served for free by accident.
func hostedShell(root topObject) bool {
	for _, tool := range root.Get("tools").Array() {
		if tool.Get("type").Str != "shell" {
			continue
		}
		hosted := false
		// Every spelling of the key is looked at (a provider may read the last of repeated
		// keys, or another case), and a local environment must say so unambiguously.
		tool.ForEach(func(k, env gjson.Result) bool {
			if strings.EqualFold(k.Str, "environment") && env.Type != gjson.Null {
				hosted = typeAmbiguous(env) || env.Get("type").Str != "local"
			}
			return !hosted
		})
		if hosted {
			return true
		}
	}
	return false
}

// typeAmbiguous reports whether a tool spells "type" more than once, or in another case: the
// gateway reads the first exact "type", a provider may read the last, or any case. Other keys
// repeated before it do not hide it (repeatedKey stops at the first repeated key of any name).
func typeAmbiguous(tool gjson.Result) bool {
	n, other := 0, false
	tool.ForEach(func(k, _ gjson.Result) bool {
		if strings.EqualFold(k.Str, "type") {
			n++
			other = other || k.Str != "type"
		}
		return true
	})
	return n > 1 || other
}

// pluginAmbiguous reports whether a router plugin entry spells a key its refusals read ("id",
// "pdf", and "engine" in its pdf options) more than once or in another case.
func pluginAmbiguous(p gjson.Result) bool {
	if !p.IsObject() {
		return false
	}
	if _, ok := repeatedKey(p, "id", "pdf"); ok {
		return true
	}
	_, ok := repeatedKey(p.Get("pdf"), "engine")
	return ok
}

// standardTiers are, per request format, the service_tier values that run at the standard
// rate, the one the price list holds. OpenAI-shaped: "auto" and "default"; "priority" and
// "scale" cost more, "flex" less. Anthropic: "auto" and "standard_only"; any other value
// means something only to a router's Anthropic-shaped endpoint serving another provider's
// model, which reads "priority" and "flex" as on its OpenAI-shaped ones.
var standardTiers = map[metering.Format][]string{
	metering.FormatChat:        {"auto", "default"},
	metering.FormatCompletions: {"auto", "default"},
	metering.FormatResponses:   {"auto", "default"},
	metering.FormatAnthropic:   {"auto", "standard_only"},
}

// unpricedTier names a service_tier other than the format's standard ones (null is unset), or
// returns "": either way off the standard rate, it would be billed at a price not configured.
func unpricedTier(format metering.Format, tier gjson.Result) string {
	standard, ok := standardTiers[format]
	if !ok || !tier.Exists() || tier.Type == gjson.Null || slices.Contains(standard, tier.Str) {
		return ""
	}
	return "'service_tier: " + quotedValue(tier.String()) + "'"
}

// routerWebSearch names a router's web search a request asks for, or returns "": OpenRouter's
// web plugin (a "plugins" entry of id "web") or a model, asked for or a fallback in "models",
// with its ":online" suffix (the same plugin). The router bills each result it fetches, or
// each search of a provider's native one, on top of the tokens; the suffixed name would be
// priced by its prefix, at the tokens alone. On every route: OpenRouter takes both on its
// Anthropic-shaped endpoint as on its OpenAI-shaped ones.
func routerWebSearch(root topObject) string {
	for _, p := range root.Get("plugins").Array() {
		if strings.EqualFold(strings.TrimSpace(p.Get("id").Str), "web") {
			return "the router's 'web' plugin (a per-result search fee)"
		}
	}
	if routerModelNamed(root, ":online") {
		return "a model named with ':online' (the router's web search: a per-result fee)"
	}
	return ""
}

// routerModelNamed reports whether the model asked for, or one in any router's fallback list
// (fallbackLists), carries the router's variant suffix (":online", ":nitro"), in any case.
// Such a name is priced by its prefix, at the base model's price, while the router bills the
// variant's.
func routerModelNamed(root topObject, suffix string) bool {
	names := []gjson.Result{root.Get("model")}
	for _, field := range fallbackLists {
		names = append(names, root.Get(field).Array()...)
	}
	for _, m := range names {
		if m.Type == gjson.String && strings.Contains(strings.ToLower(m.Str), suffix) {
			return true
		}
	}
	return false
}

// routerProviderSort returns the sort OpenRouter's provider preferences ask it to order a
// model's providers by ("provider.sort", a string or an object's "by"), as "path: value", or ""
// when it is unset or by price (":floor", the cheapest first). Sorted by throughput (":nitro"),
// latency or quality ("exacto"),
// the router turns off its price-weighted balancing and tries first the provider fastest at
// it, at that provider's rates, while the model is priced at the configured one.
//
// Vercel AI Gateway's "providerOptions.gateway.sort" is read alike: "cost" puts the cheapest
// provider first; "ttft" and "tps" the fastest, at its own list price.
func routerProviderSort(root topObject) string {
	for _, s := range []struct{ path, cheapest string }{{"provider.sort", "price"}, {"providerOptions.gateway.sort", "cost"}} {
		sort := root.Get(s.path)
		if sort.IsObject() {
			sort = sort.Get("by")
		}
		if !sort.Exists() || sort.Type == gjson.Null ||
			sort.Type == gjson.String && strings.EqualFold(strings.TrimSpace(sort.Str), s.cheapest) {
			continue
		}
		return s.path + ": " + sort.String()
	}
	return ""
}

// routerRetryFields are the body fields LiteLLM's proxy takes per-request timeouts, retries and
// fallback maps from (a timeout's aliases, the retries of its router and of the OpenAI client
// it calls with, and the fallback lists other than "fallbacks", which map a model to models
// whose prices checkFallbacks never sees). A timeout cut after the provider had the request
// answers the gateway with an error, settled at 0 while the provider billed the work; a retry
// runs the call again, billed each time and metered once. The operator's router configuration
// sets them, not a caller. So too "user_config": a whole router configuration for this request
// (its model_list, num_retries, timeout and fallbacks), which LiteLLM's proxy builds a router
// from and runs the call with (refused by its own proxy only since it banned the field, and not
// where its operator allows client-side credentials): its model_list maps the model named to
// any model, at the operator's key, and its retries and fallbacks are all the above. So too a
// top-level "model_list", which LiteLLM's completion call, handed the body's fields, takes for
// deployments to run the call on, all at once, the first answer kept (batch_completion_models):
// models the caller names, at the operator's keys, each billed and one metered.
var routerRetryFields = []string{"timeout", "request_timeout", "stream_timeout", "num_retries", "max_retries",
	"context_window_fallbacks", "content_policy_fallbacks", "user_config", "model_list"}

// routerRetryField names the first of routerRetryFields a request sets (null is unset, as the
// router reads it), or returns "".
func routerRetryField(root topObject) string {
	for _, f := range routerRetryFields {
		if v := root.Get(f); v.Exists() && v.Type != gjson.Null {
			return f
		}
	}
	return ""
}

// routerHeaderFields are the body fields LiteLLM's proxy sends to the provider as request
// headers: it unpacks the body into its completion call, whose extra_headers (and headers) it
// merges into the provider's, with no check of its own. Every header the gateway keeps from the
// provider (dropRequestHeaders, droppedPrefixes: Vertex AI's and Bedrock's priority tiers,
// Google's field mask that leaves usage out of the answer, a router's retries) went there by
// this way round. No SDK sends either key in a body (the OpenAI SDKs' extra_headers are HTTP
// headers); null or an empty object, which adds none, is served.
var routerHeaderFields = []string{"extra_headers", "headers"}

// routerHeaderField names the first of routerHeaderFields a request sets to anything but null
// or an empty object, or returns "".
func routerHeaderField(root topObject) string {
	for _, f := range routerHeaderFields {
		if v := root.Get(f); v.Exists() && v.Type != gjson.Null && !emptyObject(v) {
			return f
		}
	}
	return ""
}

// serverNativeFields are the body fields llama.cpp's server, an OpenAI-compatible upstream,
// reads under its own names before the OpenAI ones the gateway reads (it copies every field of
// the body onto its request): "n_predict" bounds the output before max_completion_tokens and
// max_tokens (-1: no bound), "n_cmpl" asks for that many completions before n. Forwarded, a
// call was held, bounded and charged for the output and the answers the OpenAI names asked for
// while the server wrote to its own, past the cap: clamped to it, unpaid.
var serverNativeFields = []string{"n_predict", "n_cmpl"}

// serverNativeField names the first of serverNativeFields a request sets (null is unset, as the
// server reads it), or returns "".
func serverNativeField(root topObject) string {
	for _, f := range serverNativeFields {
		if v := root.Get(f); v.Exists() && v.Type != gjson.Null {
			return f
		}
	}
	return ""
}

// emptyObject reports whether v is a JSON object without a member.
func emptyObject(v gjson.Result) bool {
	if !v.IsObject() {
		return false
	}
	empty := true
	v.ForEach(func(_, _ gjson.Result) bool {
		empty = false
		return false
	})
	return empty
}
