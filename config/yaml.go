package config

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// unknownSettings is how yaml.v3 words a key no setting has ("field listen_adr not found in
// type config.Config"), which names the Go type where an operator looks for a setting.
var unknownSettings = regexp.MustCompile(`field (\S+) not found in type \S+`)

// decodeFile decodes the file at path over cfg's defaults. The decode is strict, so that a
// misspelt or misplaced setting stops the start instead of leaving its default in force; what
// a typed decode cannot see at all, checkWritten finds (its errors and told, see load).
func decodeFile(path string, cfg *Config) (unwritten []error, told []string, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	// A models or plans section replaces the demo one rather than adding to it (yaml.v3
	// decodes into the existing map): only what the operator priced is priced, and an
	// operator's plans "free" and "pro" do not come with the demo's "standard" (2000
	// credits a day) as every new user's plan.
	defaults, demoPlans := cfg.Models, cfg.Plans
	cfg.Models, cfg.Plans = nil, nil
	if err := dec.Decode(cfg); err != nil {
		if strings.Contains(err.Error(), "into time.Duration") {
			return nil, nil, fmt.Errorf("config %s: %w (a duration needs its unit: 30s, 5m, 48h)", path, err)
		}
		return nil, nil, fmt.Errorf("config %s: %s", path, unknownSettings.ReplaceAllString(err.Error(), `unknown setting "$1" (misspelt, or under the wrong section?)`))
	}
	// Only a section left out keeps the demo's. One written with no value (`plans:`, `plans: ~`,
	// a template that rendered nothing there) is YAML's null, which leaves the map nil as if it
	// were left out: the demo's plans came back, standard's 2000 credits a day for every new
	// user and for every user whose plan the operator meant to write, without a word. Kept
	// empty, it is refused as `plans: {}` is (validate: no plan configured, no model priced).
	if cfg.Models == nil && !sectionWritten(raw, "models") {
		cfg.Models = defaults
	}
	if cfg.Plans == nil && !sectionWritten(raw, "plans") {
		cfg.Plans = demoPlans
	}
	unwritten, told = checkWritten(raw)
	priceUnwrittenCaches(raw, cfg.Models)
	return unwritten, told, nil
}

// sectionWritten reports whether raw's top level writes the setting name, with a value or
// without one.
func sectionWritten(raw []byte, name string) bool {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil || len(doc.Content) == 0 {
		return false
	}
	return mappingValue(doc.Content[0], name) != nil
}

// priceUnwrittenCaches prices the cache reads and writes of each model in raw's models that
// leaves their price out at its input price: decoded as 0, every cached prompt token (OpenAI
// caches prompts of 1 024 tokens and more on its own) and every cache write was served free
// by a config that never said so. A price written, 0 included, stands.
func priceUnwrittenCaches(raw []byte, models map[string]ModelCfg) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil || len(doc.Content) == 0 {
		return
	}
	entries := mappingValue(doc.Content[0], "models")
	if entries == nil || entries.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(entries.Content); i += 2 {
		name, fields := entries.Content[i].Value, entries.Content[i+1]
		if fields.Kind == yaml.AliasNode {
			fields = fields.Alias
		}
		m, ok := models[name]
		if !ok || fields.Kind != yaml.MappingNode {
			continue // refused by checkWritten
		}
		if mappingValue(fields, "cache_read") == nil {
			m.CacheRead = m.Input
		}
		if mappingValue(fields, "cache_write") == nil {
			m.CacheWrite = m.Input
		}
		if long := mappingValue(fields, "long_context"); long != nil {
			if mappingValue(long, "cache_read") == nil {
				m.LongContext.CacheRead = m.LongContext.Input
			}
			if mappingValue(long, "cache_write") == nil {
				m.LongContext.CacheWrite = m.LongContext.Input
			}
		}
		models[name] = m
	}
}

// requiredModelFields, requiredLongContextFields and requiredPlanFields must be written in a
// config file's models, their long_context prices and its plans: each decodes as 0 when left
// out, and 0 is a valid amount (a free model, a plan without a daily allowance) that nobody
// meant by leaving the field out.
var (
	requiredModelFields       = []string{"input", "output"}
	requiredLongContextFields = []string{"above_prompt_tokens", "input", "output"}
	requiredPlanFields        = []string{"allowance_credits", "hold_normal_credits", "hold_heavy_credits",
		"heavy_after_turns", "max_in_flight", "max_run_cost_credits"}
)

// checkWritten reports what a typed decode cannot see: a fraction in an integer setting, a
// required price or plan field left out, and any price or plan field left empty (`input:` is
// YAML's null, which decodes as 0). It also returns the price and plan fields it named, so
// that the checks of their (zero) values do not name each a second time.
func checkWritten(raw []byte) (errs []error, told []string) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil || len(doc.Content) == 0 {
		return nil, nil // the typed decode has reported it, or the file is empty
	}
	errs = checkWhole(doc.Content[0], reflect.TypeOf(Config{}), "")
	for _, sec := range []struct {
		name     string
		required []string
		// mustBeWritten says whether a field left empty is refused: every plan field, and a
		// model's prices (its bounds' zero values are their documented defaults).
		mustBeWritten func(key string) bool
	}{{"models", requiredModelFields, isModelPrice}, {"plans", requiredPlanFields, func(string) bool { return true }}} {
		entries := mappingValue(doc.Content[0], sec.name)
		if entries == nil || entries.Kind != yaml.MappingNode {
			continue
		}
		for i := 0; i+1 < len(entries.Content); i += 2 {
			at := sec.name + "." + entries.Content[i].Value
			fields := entries.Content[i+1]
			if fields.Kind == yaml.AliasNode {
				fields = fields.Alias
			}
			e, t := checkEntry(at, sec.name+" entry", fields, sec.required, sec.mustBeWritten)
			errs, told = append(errs, e...), append(told, t...)
			if sec.name != "models" || fields.Kind != yaml.MappingNode {
				continue
			}
			if long := mappingValue(fields, "long_context"); long != nil {
				// Every field of a long-context price is a figure 0 would misstate.
				e, t := checkEntry(at+".long_context", "long_context block", long, requiredLongContextFields, func(string) bool { return true })
				errs, told = append(errs, e...), append(told, t...)
			}
		}
	}
	return errs, told
}

// zeroHint is what a missing or empty field's error adds: 0 is a price or a daily allowance an
// operator may mean, never a long-context line, a hold, a cap, a count of calls or of turns (0
// is refused in turn: hinted at, it sent the operator from one refusal to the next).
func zeroHint(field string) string {
	switch field {
	case "above_prompt_tokens":
		return "; write the prompt size past which the block's prices apply"
	case "hold_normal_credits", "hold_heavy_credits", "max_run_cost_credits", "max_in_flight", "heavy_after_turns":
		return "; write a figure above 0"
	}
	return "; write 0 if 0 is meant"
}

// checkEntry reports what the typed decode of one entry (fields, named at; one of what) cannot
// see: the entry not a mapping, a field in required left out, a field mustBeWritten says must
// be written left empty. told names the fields it reported.
func checkEntry(at, what string, fields *yaml.Node, required []string, mustBeWritten func(string) bool) (errs []error, told []string) {
	if fields.Kind == yaml.AliasNode {
		fields = fields.Alias // pro: *standard, the same fields
	}
	if fields.Kind != yaml.MappingNode {
		return []error{fmt.Errorf("%s: line %d: must be a mapping of its fields", at, fields.Line)}, nil
	}
	for j := 0; j+1 < len(fields.Content); j += 2 {
		if v := fields.Content[j+1]; v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" && mustBeWritten(fields.Content[j].Value) {
			errs = append(errs, fmt.Errorf("%s.%s: line %d: is empty%s", at, fields.Content[j].Value, v.Line, zeroHint(fields.Content[j].Value)))
			told = append(told, at+"."+fields.Content[j].Value)
		}
	}
	for _, f := range required {
		if mappingValue(fields, f) == nil {
			errs = append(errs, fmt.Errorf("%s.%s: line %d: is missing (every %s sets it%s)", at, f, fields.Line, what, zeroHint(f)))
			told = append(told, at+"."+f)
		}
	}
	return errs, told
}

// isModelPrice reports whether key names a price field of a models entry.
func isModelPrice(key string) bool {
	t := reflect.TypeOf(ModelCfg{})
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == key {
			return t.Field(i).Type == reflect.TypeOf(USDPerM{})
		}
	}
	return false
}

// checkWhole reports an integer setting not written in plain decimal digits: YAML decodes 12.5
// into an int as 12 and 0200 as 128, silently. n is the node decoded into a value of type t,
// named at (its YAML path).
func checkWhole(n *yaml.Node, t reflect.Type, at string) []error {
	var errs []error
	join := func(key string) string {
		if at == "" {
			return key
		}
		return at + "." + key
	}
	switch {
	case n.Kind == yaml.ScalarNode:
		if t != reflect.TypeOf(time.Duration(0)) && t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64 &&
			n.ShortTag() != "!!null" && !plainInteger(n.Value) {
			errs = append(errs, fmt.Errorf("%s: line %d: %s is not a whole number in decimal digits (YAML drops a fraction and reads 0200 as octal)", at, n.Line, n.Value))
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].ShortTag() == "!!merge" {
				errs = append(errs, checkMerged(n.Content[i+1], t, at)...)
				continue
			}
			for f := range t.NumField() {
				if tag, _, _ := strings.Cut(t.Field(f).Tag.Get("yaml"), ","); tag == n.Content[i].Value {
					errs = append(errs, checkWhole(n.Content[i+1], t.Field(f).Type, join(tag))...)
				}
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].ShortTag() == "!!merge" {
				errs = append(errs, checkMerged(n.Content[i+1], t, at)...)
				continue
			}
			errs = append(errs, checkWhole(n.Content[i+1], t.Elem(), join(n.Content[i].Value))...)
		}
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for i, e := range n.Content {
			errs = append(errs, checkWhole(e, t.Elem(), fmt.Sprintf("%s[%d]", at, i))...)
		}
	}
	return errs
}

// checkMerged is checkWhole of what a merge key (`<<: {max_in_flight: 2.5}`, `<<: *base`,
// `<<: [*a, {...}]`) brings into a mapping decoded into a value of type t, named at: yaml.v3
// decodes the merged fields as the mapping's own, so a fraction or a leading zero there was
// dropped or read as octal as silently as written in place (discount_bp: 0150 was 104 basis
// points). An anchor's mapping is checked again here, under the path it is merged into.
func checkMerged(v *yaml.Node, t reflect.Type, at string) []error {
	if v.Kind == yaml.AliasNode {
		v = v.Alias
	}
	if v == nil {
		return nil
	}
	if v.Kind == yaml.SequenceNode {
		var errs []error
		for _, m := range v.Content {
			errs = append(errs, checkMerged(m, t, at)...)
		}
		return errs
	}
	return checkWhole(v, t, at)
}

// plainInteger reports whether s is an integer as an operator means it: decimal digits, an
// optional sign, no leading zero (which YAML reads as octal), no fraction, exponent or base.
func plainInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// mappingValue is the value of key in mapping node m, or nil: written in m itself, or in a
// mapping m takes through a merge key (`<<: *base`, `<<: [*a, *b]`).
func mappingValue(m *yaml.Node, key string) *yaml.Node {
	if m.Kind == yaml.AliasNode {
		m = m.Alias
	}
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	var merged []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		switch k, v := m.Content[i], m.Content[i+1]; {
		case k.ShortTag() == "!!merge" && v.Kind == yaml.SequenceNode:
			merged = append(merged, v.Content...)
		case k.ShortTag() == "!!merge":
			merged = append(merged, v)
		case k.Value == key:
			return v
		}
	}
	for _, from := range merged {
		if v := mappingValue(from, key); v != nil {
			return v
		}
	}
	return nil
}
