package proxy

import (
	"fmt"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// A call's worst case, which the hold is sized at: its output bound and the price it is reckoned
// at, and the body's rewrite that keeps it within the cap.

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
