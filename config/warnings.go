package config

import (
	"fmt"
	"strings"
	"time"
)

// Warnings lists settings that are valid but weaken a guarantee, for the log at start. A
// hold shorter than the longest call stops counting in flight when it expires while its call
// still runs (the reconciler pushes a leased hold out, but only at its next pass; what it
// holds counts against the balance until it settles), so in that window a user may be
// admitted past max_in_flight. The defaults keep every hold 2.5 times the longest call; tests
// shorten them on purpose.
func (c *Config) Warnings() []string {
	longest := c.Limits.UpstreamTimeout + c.Limits.ClientWriteTimeout
	var out []string
	for _, t := range []struct {
		name string
		d    time.Duration
	}{{"holds.hold_ttl", c.Holds.HoldTTL}, {"holds.run_ttl", c.Holds.RunTTL}} {
		if t.d < longest {
			out = append(out, fmt.Sprintf("%s %v is shorter than the longest call (upstream_timeout + client_write_timeout = %v): "+
				"a call that outlives its hold stops counting against max_in_flight until the reconciler extends it", t.name, t.d, longest))
		}
	}
	if c.Limits.HeaderTimeout >= c.Limits.UpstreamTimeout {
		out = append(out, fmt.Sprintf("limits.header_timeout %v is not shorter than limits.upstream_timeout %v: the whole call is cut first, so it never applies",
			c.Limits.HeaderTimeout, c.Limits.UpstreamTimeout))
	}
	for _, name := range sortedKeys(c.Models) {
		if !c.served(name) {
			out = append(out, fmt.Sprintf("models.%s is priced but no upstream serves it: requests for it are refused (model_not_served)", name))
		}
	}
	return out
}

// served reports whether some upstream serves priced name, or a model it prices as a prefix.
func (c *Config) served(name string) bool {
	if _, ok := c.UpstreamFor(name); ok {
		return true
	}
	for _, u := range c.Upstreams {
		for _, m := range u.Models {
			if m != "*" && strings.HasPrefix(strings.TrimSuffix(m, "*"), name) {
				return true
			}
		}
	}
	return false
}
