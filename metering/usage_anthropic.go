package metering

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// anthropicEvent handles one Anthropic Messages event of type typ.
func (m *Meter) anthropicEvent(s, typ string) {
	switch typ {
	case "message_start":
		// Anthropic's message_start counts the prompt. The shims that serve other models in
		// its format open with a placeholder of zeros ({"input_tokens":0,"output_tokens":0})
		// and count the call in message_delta: read as a report, a stream of theirs cut before
		// message_delta had its prompt charged at 0. It is none, as an empty usage is none.
		if u := gjson.Get(s, "message.usage"); u.IsObject() && !anthropicCountsNothing(u) {
			m.anthropicUsage(u)
		}
		keepName(&m.res.Model, gjson.Get(s, "message.model"), false)
	case "message_delta":
		// With no report before it (message_start's of zeros is none), a usage of zeros is no
		// report either: a shim that counts nothing had the whole answer charged 0, where it
		// is estimated. After a real message_start, a delta's output of 0 is final (an answer
		// that made nothing).
		if u := gjson.Get(s, "usage"); u.IsObject() && (m.res.Reported || !anthropicCountsNothing(u)) && m.anthropicUsage(u) {
			m.outputFinal = true
		}
	case "content_block_delta":
		d := gjson.Get(s, "delta")
		switch d.Get("type").Str {
		case "text_delta":
			m.res.OutputChars += strLen(d.Get("text"))
		case "thinking_delta":
			m.res.OutputChars += strLen(d.Get("thinking"))
		case "input_json_delta":
			m.res.OutputChars += strLen(d.Get("partial_json"))
		case "compaction_delta":
			m.res.OutputChars += strLen(d.Get("content"))
		}
	case "error":
		m.res.UpstreamError = true
	}
}

// anthropicFields are Anthropic's usage fields in the order of pricing.Usage's fields, then
// the five-minute writes. input_tokens already excludes both kinds of cache tokens;
// cache_creation_input_tokens counts the five-minute and the one-hour writes, which
// cache_creation breaks out.
var anthropicFields = [6]string{"input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens",
	"cache_creation.ephemeral_1h_input_tokens", "cache_creation.ephemeral_5m_input_tokens"}

// anthropicOutput is output_tokens' index in anthropicFields.
const anthropicOutput = 3

// anthropicCountsNothing reports whether u, an Anthropic usage, gives no figure above 0, at its
// top level or in its iterations.
func anthropicCountsNothing(u gjson.Result) bool {
	zeros := func(v gjson.Result) bool {
		for _, f := range anthropicFields {
			if n, _ := first(v, f); n > 0 {
				return false
			}
		}
		return true
	}
	nothing := zeros(u)
	u.Get("iterations").ForEach(func(_, it gjson.Result) bool {
		nothing = nothing && zeros(it)
		return nothing
	})
	return nothing
}

// anthropicUsage applies one Anthropic usage object: each field present replaces the one
// before (message_delta carries cumulative counts). With iterations[] (compaction, server
// tools) the top-level fields describe only the last iteration, so each field is the sum
// over the iterations instead.
//
// A top-level 0 does not replace an earlier count of the prompt side (input, cache reads and
// writes): a cumulative count cannot fall to nothing, and Anthropic-compatible servers
// (SGLang's /v1/messages, among others) send message_delta's input_tokens as 0 after
// message_start gave the count. Replaced, the prompt was billed at 0. The output's 0 still
// replaces message_start's placeholder, but not a final count (outputFinal) above 0. It
// reports whether u gave a count of the output (at the top or in an iteration): one that did
// not says nothing of it.
func (m *Meter) anthropicUsage(u gjson.Result) (outputCounted bool) {
	var sum [len(anthropicFields)]int64
	var inIter, top [len(anthropicFields)]bool
	u.Get("iterations").ForEach(func(_, it gjson.Result) bool {
		for i, f := range anthropicFields {
			if v, ok := first(it, f); ok {
				sum[i] = min(sum[i]+v, pricing.MaxTokens)
				inIter[i] = true
			}
		}
		return true
	})
	fields := [len(anthropicFields)]*int64{&m.res.Usage.Input, &m.res.Usage.CacheRead, &m.res.Usage.CacheWrite, &m.res.Usage.Output,
		&m.res.Usage.CacheWrite1h, &m.res.CacheWrite5m}
	for i, f := range anthropicFields {
		if inIter[i] {
			*fields[i] = sum[i]
		} else if v, ok := first(u, f); ok {
			// The output's 0 replaces message_start's placeholder, not a final count a
			// message_delta gave before it (a proxy's second message_delta of zeros).
			if v > 0 || (i == anthropicOutput && !(m.outputFinal && *fields[i] > 0)) {
				*fields[i] = v
			}
			top[i] = true
		}
	}
	if inIter != [len(anthropicFields)]bool{} || top != [len(anthropicFields)]bool{} {
		m.res.Reported = true
	}
	m.anthropicInput = m.anthropicInput || inIter[0] || top[0]
	return inIter[anthropicOutput] || top[anthropicOutput]
}
