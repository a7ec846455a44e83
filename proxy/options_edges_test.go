package proxy_test

import (
	"net/http"
	"testing"
)

// TestUnpricedOptionsAtTheirEdgesAreRefusedAndUnsetOnesServed: the refusals of options the
// price list cannot express read each option as the provider or router would, not only in the
// spelling the examples use, and a field set to null (unset, as clients that write every
// optional field send it) is no option at all.
//
//   - Refused, before anything is held or forwarded: an image or a spoken answer asked for
//     with the modality in another case or padded; Bedrock's performanceConfig that is not an object (no
//     standard latency it could say); a hosted shell whose environment spells its type twice
//     or names a container before a local one; a one-token audio clip on a model without an
//     audio input price; a completions call off the standard tier; a router's web plugin named
//     in another case, or its pdf options repeated with a free engine first; a cache_control
//     ttl that is a number or an object; extra_body that is not an object.
//   - Served: a null preset, a null web_search_options and a Bedrock serviceTier whose type is
//     null.
func TestUnpricedOptionsAtTheirEdgesAreRefusedAndUnsetOnesServed(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	const chat, responses, completions, messages = "/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/messages"
	refused := []struct{ name, path, body string }{
		{"image modality in another case", chat, `{"model":"fake-gpt","modalities":["text"," Image"],"messages":[{"role":"user","content":"draw a cat"}]}`},
		// fake-gpt has no audio output price: a spoken answer is refused in any spelling.
		{"audio answer modality in another case", chat, `{"model":"fake-gpt","modalities":["text"," Audio"],"messages":[{"role":"user","content":"say hi"}]}`},
		{"Bedrock performanceConfig not an object", chat, `{"model":"fake-gpt","performanceConfig":"optimized","messages":[{"role":"user","content":"hi"}]}`},
		// fake-gpt has no audio input price; an empty WAV clip is estimated at one token.
		{"audio input of one token", chat, `{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + wavSeconds(0) + `","format":"wav"}}]}]}`},
		{"hosted shell, environment type repeated", responses, `{"model":"fake-gpt","tools":[{"type":"shell","environment":{"type":"local","type":"container_auto"}}],"input":"hi"}`},
		{"hosted shell before a repeated local environment", responses, `{"model":"fake-gpt","tools":[{"type":"shell","environment":{"type":"container_auto"},"environment":{"type":"local"}}],"input":"hi"}`},
		{"completions priority tier", completions, `{"model":"fake-gpt","service_tier":"priority","prompt":"hi"}`},
		{"router web plugin in another case", chat, `{"model":"fake-gpt","plugins":[{"id":" Web"}],"messages":[{"role":"user","content":"hi"}]}`},
		{"router pdf options repeated, free engine first", chat, `{"model":"fake-gpt","plugins":[{"id":"file-parser","pdf":{"engine":"pdf-text"},"pdf":{"engine":"mistral-ocr"}}],"messages":[{"role":"user","content":"hi"}]}`},
		// claude-test has no one-hour cache write price: a ttl other than "5m" or null asks
		// for a longer cache, whatever its JSON type.
		{"cache ttl as a number", messages, `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","ttl":3600}}]}]}`},
		{"cache ttl as an object", messages, `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","ttl":{"hours":1}}}]}]}`},
		{"extra_body not an object", chat, `{"model":"fake-gpt","extra_body":["service_tier","priority"],"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unpriced_option")
		})
	}
	served := []struct{ name, path, body string }{
		{"null preset", responses, `{"model":"fake-gpt","preset":null,"input":"hi"}`},
		{"null web_search_options", chat, `{"model":"fake-gpt","web_search_options":null,"messages":[{"role":"user","content":"hi"}]}`},
		{"Bedrock tier of null type", chat, `{"model":"fake-gpt","serviceTier":{"type":null},"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range served {
		t.Run("served/"+tc.name, func(t *testing.T) {
			h.postOK(t, key, tc.path, tc.body, nil)
		})
	}
}
