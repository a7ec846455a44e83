package proxy

import (
	"net/http"
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
func unpricedOption(format metering.Format, root gjson.Result, header http.Header, price pricing.Price) string {
	switch format {
	case metering.FormatChat, metering.FormatCompletions, metering.FormatResponses:
		// "auto" and "default" run at the standard rate; "priority" and "scale" cost more,
		// "flex" less: either way not the price configured.
		if t := root.Get("service_tier"); t.Exists() && t.Type != gjson.Null && t.Str != "auto" && t.Str != "default" {
			return "'service_tier: " + t.String() + "'"
		}
	}
	for _, tool := range root.Get("tools").Array() {
		if typeAmbiguous(tool) {
			// The gateway would read one type of tool and the provider run another.
			return "a tool whose 'type' is repeated"
		}
	}
	switch format {
	case metering.FormatChat:
		if v := root.Get("web_search_options"); v.Exists() && v.Type != gjson.Null {
			return "'web_search_options' (a per-search fee)"
		}
		if v := root.Get("audio"); v.Exists() && v.Type != gjson.Null {
			return "'audio' output (audio tokens)"
		}
		for _, m := range root.Get("modalities").Array() {
			if m.Str == "audio" {
				return "'modalities: audio' (audio tokens)"
			}
		}
	case metering.FormatResponses:
		if t := firstTool(root, "web_search", "file_search", "code_interpreter", "image_generation"); t != "" {
			return "the hosted tool '" + t + "' (a per-call fee)"
		}
	case metering.FormatAnthropic:
		if t := firstTool(root, "web_search", "code_execution"); t != "" {
			return "the server tool '" + t + "' (a per-use fee)"
		}
		for _, v := range header.Values("Anthropic-Beta") {
			if strings.Contains(v, "context-1m") {
				return "the 'context-1m' beta (long-context rates)"
			}
		}
		if price.CacheWrite1h == 0 && asksLongCache(root) {
			return "'cache_control' with a 'ttl' other than 5m (one-hour cache writes, unpriced for this model)"
		}
	}
	return ""
}

// asksLongCache reports whether any cache_control in v, at any depth (system, messages,
// their content blocks, tools, the top level), asks for a ttl other than the default five
// minutes: the provider then bills the cache write at its one-hour rate. Keys and values are
// compared unescaped, as the provider reads them.
func asksLongCache(v gjson.Result) bool {
	found := false
	v.ForEach(func(k, child gjson.Result) bool {
		if k.Str == "cache_control" && child.IsObject() {
			child.ForEach(func(k, ttl gjson.Result) bool {
				found = found || (k.Str == "ttl" && !(ttl.Type == gjson.String && ttl.Str == "5m") && ttl.Type != gjson.Null)
				return !found
			})
		}
		if !found && (child.IsObject() || child.IsArray()) {
			found = asksLongCache(child)
		}
		return !found
	})
	return found
}

// firstTool returns the type of the first entry of the request's tools whose type starts
// with one of families (types carry a version or variant: web_search_preview,
// web_search_20250305), or "".
func firstTool(root gjson.Result, families ...string) string {
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
