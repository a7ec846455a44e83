package proxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// maxRefusalAnswer bounds a refusal's whole answer in the test below: its fixed words, the
// error's shape and the value it quotes, cut.
const maxRefusalAnswer = 4 << 10

// TestRefusalsQuoteBoundedValues: a request refused for what it sends (a repeated key, an
// option billed at rates the gateway has no price for, an unpriced fallback) was answered with
// the value it names quoted whole: a key, the path of objects above it, a model name, an
// option's value, of any length up to max_body_bytes. The answer grew with the body, up to six
// times its size once JSON-escaped ('<' is sent as \u003c), built in memory and sent before
// anything was held, by any key, one with no credits too; the path of a repeated key was
// built by concatenating every enclosing key again at each level, a time quadratic in the body
// (seconds of CPU for a 2 MiB body). Each refusal names the value, cut to a bounded quote, and
// answers in a few KiB.
func TestRefusalsQuoteBoundedValues(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	const chat = "/v1/chat/completions"
	big := strings.Repeat("<", 256<<10)
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	var deep strings.Builder // a repeated key below 256 objects, each under a 1 KiB key
	long := strings.Repeat("k", 1<<10)
	deep.WriteString(`{"model":"fake-gpt",` + msgs + `,`)
	for range 256 {
		deep.WriteString(`"` + long + `":{`)
	}
	deep.WriteString(`"a":1,"a":2` + strings.Repeat("}", 256) + `}`)
	cases := []struct{ name, body, code string }{
		{"repeated key", `{"model":"fake-gpt",` + msgs + `,"` + big + `":1,"` + big + `":2}`, "invalid_json"},
		{"repeated key deep below long keys", deep.String(), "invalid_json"},
		{"speed", `{"model":"fake-gpt",` + msgs + `,"speed":"` + big + `"}`, "unpriced_option"},
		{"inference_geo", `{"model":"fake-gpt",` + msgs + `,"inference_geo":"` + big + `"}`, "unpriced_option"},
		{"service_tier", `{"model":"fake-gpt",` + msgs + `,"service_tier":"` + big + `"}`, "unpriced_option"},
		{"Bedrock latency", `{"model":"fake-gpt",` + msgs + `,"performanceConfig":{"latency":"` + big + `"}}`, "unpriced_option"},
		{"Bedrock tier", `{"model":"fake-gpt",` + msgs + `,"serviceTier":{"type":"` + big + `"}}`, "unpriced_option"},
		{"router server tool", `{"model":"fake-gpt",` + msgs + `,"tools":[{"type":"openrouter:` + big + `"}]}`, "unpriced_option"},
		{"unpriced fallback", `{"model":"fake-gpt",` + msgs + `,"models":["` + big + `"]}`, "unpriced_option"},
		{"fast fallback under a priced prefix", `{"model":"fake-gpt",` + msgs + `,"models":["fake-gpt-fast` + big + `"]}`, "unpriced_option"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(key, chat, tc.body, nil)
			answer := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || errorCode(t, answer) != tc.code {
				t.Fatalf("%d %.300s, want 400 %s", resp.StatusCode, answer, tc.code)
			}
			if len(answer) > maxRefusalAnswer {
				t.Fatalf("a %d-byte body refused with a %d-byte answer, want at most %d: %.300s…",
					len(tc.body), len(answer), maxRefusalAnswer, answer)
			}
		})
	}
}
