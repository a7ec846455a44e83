package config

import (
	"strings"
	"testing"
)

// A base_url's port past 65535 parsed as a URL, so the start went on and every call to that
// upstream failed to dial (502 upstream_unreachable).
func TestUpstreamBaseURLPortOutOfRangeIsRefused(t *testing.T) {
	for _, base := range []string{"http://llm.internal:99999", "http://llm.internal:0"} {
		_, err := loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: "+base+"\n    models: ['*']\n")
		if err == nil || !strings.Contains(err.Error(), "upstreams[0].base_url") || !strings.Contains(err.Error(), "port") {
			t.Errorf("base_url %s: error %v, want it to name upstreams[0].base_url and its port", base, err)
		}
	}
	if _, err := loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: http://llm.internal:65535\n    models: ['*']\n"); err != nil {
		t.Errorf("port 65535 refused: %v", err)
	}
}
