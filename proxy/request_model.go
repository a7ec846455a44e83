package proxy

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// The model a call names and the models a router may answer it with instead: their prices and
// output limits, or the call's refusal.

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
