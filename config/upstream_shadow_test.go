package config

import (
	"strings"
	"testing"
)

// A request goes to the first upstream that lists its model by that entry (exact name, then
// prefix, then "*"): an entry an earlier upstream already lists serves nothing. An operator
// who lists a model under a second upstream as a fallback, or moves it to a new provider and
// leaves the old entry above, had every call go to the first, silently. Like an entry that
// matches no priced model, it stops the start, naming both upstreams.
func TestUpstreamModelEntryAnEarlierUpstreamListsIsRefused(t *testing.T) {
	const models = "models:\n  gpt-4o:\n    input: 2.5\n    output: 10\n"
	two := func(first, second string) string {
		return models + "upstreams:\n" +
			"  - name: old\n    kind: openai\n    base_url: https://old.example\n    models: " + first + "\n" +
			"  - name: new\n    kind: openai\n    base_url: https://new.example\n    models: " + second + "\n"
	}
	for _, tc := range []struct{ first, second, entry string }{
		{"['gpt-4o']", "['gpt-4o']", "gpt-4o"},
		{"['gpt-*']", "['gpt-*']", "gpt-*"},
		{"['*']", "['*']", "*"},
		// A prefix inside an earlier upstream's shorter one: the first prefix that matches
		// takes the request, so "gpt-4o*" below "gpt-*" serves nothing either.
		{"['gpt-*']", "['gpt-4o*']", "gpt-4o*"},
	} {
		_, err := loadYAML(t, two(tc.first, tc.second))
		if err == nil || !strings.Contains(err.Error(), "upstreams[1].models") || !strings.Contains(err.Error(), "upstreams[0]") ||
			!strings.Contains(err.Error(), `"`+tc.entry+`"`) {
			t.Errorf("%s then %s: error %v, want it to name upstreams[1].models, %q and upstreams[0]", tc.first, tc.second, err, tc.entry)
		}
	}
	// Not shadowed: an exact name under a prefix or "*" of an earlier upstream wins over them.
	for _, tc := range []struct{ first, second string }{{"['*']", "['gpt-4o']"}, {"['gpt-*']", "['gpt-4o']"}, {"['*']", "['gpt-*']"},
		{"['gpt-4o*']", "['gpt-*']"}} {
		if _, err := loadYAML(t, two(tc.first, tc.second)); err != nil {
			t.Errorf("%s then %s refused: %v", tc.first, tc.second, err)
		}
	}
}
