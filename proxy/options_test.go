package proxy_test

import (
	"net/http"
	"testing"
)

// TestOptionsBilledAtOtherRatesAreRefused: an option that makes the provider bill at a rate
// the price list has no column for — a dearer service tier, a hosted tool's per-call fee,
// audio tokens, long-context rates — would be charged at the model's token prices, and the
// difference paid by the operator. Such a request is refused before anything is held or
// forwarded; the same routes without the option, or with options that cost only tokens,
// are served.
func TestOptionsBilledAtOtherRatesAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const chat, responses, messages = "/v1/chat/completions", "/v1/responses", "/v1/messages"
	refused := []struct {
		name, path, body string
		header           map[string]string
	}{
		{"priority tier", chat, `{"model":"fake-gpt","service_tier":"priority","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"flex tier", chat, `{"model":"fake-gpt","service_tier":"flex","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"scale tier on responses", responses, `{"model":"fake-gpt","service_tier":"scale","input":"hi"}`, nil},
		{"web search options", chat, `{"model":"fake-gpt","web_search_options":{},"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"audio output", chat, `{"model":"fake-gpt","audio":{"voice":"alloy","format":"wav"},"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"audio modality", chat, `{"model":"fake-gpt","modalities":["text","audio"],"messages":[{"role":"user","content":"hi"}]}`, nil},
		// A router's image generation (OpenRouter's, Gemini's image models): image output
		// tokens, at many times the text output price, which the price list has no column for.
		{"image modality", chat, `{"model":"fake-gpt","modalities":["image","text"],"messages":[{"role":"user","content":"draw a cat"}]}`, nil},
		// fake-gpt has no audio input price.
		{"audio input part", chat, `{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"transcribe"},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}`, nil},
		{"audio input part, escaped type", chat, `{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"input\u005faudio","input\u005faudio":{"data":"AAAA","format":"wav"}}]}]}`, nil},
		{"audio input part, type key in another case", chat, `{"model":"fake-gpt","messages":[{"role":"user","content":[{"Type":"input_audio","data":"AAAA"}]}]}`, nil},
		{"audio payload under another type", chat, `{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"x","input_audio":{"data":"AAAA","format":"wav"}}]}]}`, nil},
		{"earlier spoken answer sent back", chat, `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","audio":{"id":"audio_abc123"}},{"role":"user","content":"again"}]}`, nil},
		{"earlier spoken answer sent back, key in another case", chat, `{"model":"fake-gpt","messages":[{"role":"assistant","Audio":{"id":"audio_abc123"}},{"role":"user","content":"again"}]}`, nil},
		{"earlier spoken answer sent back, key escaped", chat, `{"model":"fake-gpt","messages":[{"role":"assistant","\u0061udio":{"id":"audio_abc123"}},{"role":"user","content":"again"}]}`, nil},
		{"audio input part on responses", responses, `{"model":"fake-gpt","input":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"mp3"}}]}]}`, nil},
		{"hosted web search", responses, `{"model":"fake-gpt","tools":[{"type":"function","name":"f","parameters":{}},{"type":"web_search_preview"}],"input":"hi"}`, nil},
		// The hosted shell runs in a container OpenAI provisions (container_auto) or one the
		// caller names (container_reference): billed per container, as code_interpreter's are.
		{"hosted shell in a new container", responses, `{"model":"fake-gpt","tools":[{"type":"shell","environment":{"type":"container_auto"}}],"input":"hi"}`, nil},
		{"hosted shell in a named container", responses, `{"model":"fake-gpt","tools":[{"type":"shell","environment":{"type":"container_reference","container_id":"cntr_1"}}],"input":"hi"}`, nil},
		{"hosted shell behind a repeated local environment", responses, `{"model":"fake-gpt","tools":[{"type":"shell","environment":{"type":"local"},"environment":{"type":"container_auto"}}],"input":"hi"}`, nil},
		// xAI's server tools: a fee per call (its web search and code interpreter take
		// OpenAI's names).
		{"xai x search", responses, `{"model":"fake-gpt","tools":[{"type":"x_search"}],"input":"hi"}`, nil},
		{"xai collections search", responses, `{"model":"fake-gpt","tools":[{"type":"collections_search","collection_ids":["c1"]}],"input":"hi"}`, nil},
		{"xai x search on chat", chat, `{"model":"fake-gpt","tools":[{"type":"x_search"}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"xai code execution on chat", chat, `{"model":"fake-gpt","tools":[{"type":"code_execution"}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		// Perplexity's and Groq's tools, Mistral's connectors on chat: a fee per call.
		{"perplexity fetch url", responses, `{"model":"fake-gpt","tools":[{"type":"fetch_url"}],"input":"hi"}`, nil},
		{"perplexity finance search", responses, `{"model":"fake-gpt","tools":[{"type":"finance_search"}],"input":"hi"}`, nil},
		{"groq browser search", chat, `{"model":"fake-gpt","tools":[{"type":"browser_search"}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"code interpreter on chat", chat, `{"model":"fake-gpt","tools":[{"type":"code_interpreter"}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"image generation on chat", chat, `{"model":"fake-gpt","tools":[{"type":"image_generation"}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		// Gemini's grounding in its own shape, which a router (LiteLLM) passes on: no type,
		// a fee per search query or grounded prompt.
		{"gemini google search", chat, `{"model":"fake-gpt","tools":[{"type":"function","function":{"name":"f","parameters":{}}},{"googleSearch":{}}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"gemini google search, snake case", chat, `{"model":"fake-gpt","tools":[{"google_search":{}}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"gemini search retrieval", chat, `{"model":"fake-gpt","tools":[{"Google_Search_Retrieval":{"dynamic_retrieval_config":{"mode":"MODE_DYNAMIC"}}}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"gemini maps, escaped", chat, `{"model":"fake-gpt","tools":[{"google\u004daps":{}}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"gemini enterprise web search on responses", responses, `{"model":"fake-gpt","tools":[{"enterpriseWebSearch":{}}],"input":"hi"}`, nil},
		{"hosted file search", responses, `{"model":"fake-gpt","tools":[{"type":"file_search","vector_store_ids":["vs_1"]}],"input":"hi"}`, nil},
		{"tool type repeated", responses, `{"model":"fake-gpt","tools":[{"type":"function","name":"f","type":"web_search"}],"input":"hi"}`, nil},
		{"tool type repeated after another key", responses, `{"model":"fake-gpt","tools":[{"type":"function","name":"f","name":"g","type":"web_search_preview"}],"input":"hi"}`, nil},
		{"tool type in another case", responses, `{"model":"fake-gpt","tools":[{"type":"function","name":"f","Type":"web_search_preview"}],"input":"hi"}`, nil},
		{"anthropic web search", messages, `{"model":"claude-test","max_tokens":50,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"anthropic code execution", messages, `{"model":"claude-test","max_tokens":50,"tools":[{"type":"code_execution_20250522","name":"code_execution"}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"anthropic 1m context", messages, `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"Anthropic-Beta": "interleaved-thinking-2025-05-14,context-1m-2025-08-07"}},
		// claude-test has no one-hour cache write price.
		{"anthropic one-hour cache on the system prompt", messages, `{"model":"claude-test","max_tokens":50,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"anthropic one-hour cache on a message block, escaped", messages, `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","\u0074tl":"\u0031h"}}]}]}`, nil},
		{"anthropic one-hour cache, keys in another case", messages, `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"hi","Cache_Control":{"type":"ephemeral","TTL":"1h"}}]}]}`, nil},
		{"anthropic one-hour cache on a tool", messages, `{"model":"claude-test","max_tokens":50,"tools":[{"name":"f","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"hi"}]}`, nil},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			calls, runs := h.fake.Calls(), h.runCount(u.ID)
			resp := h.post(key, tc.path, tc.body, tc.header)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != "unpriced_option" {
				t.Fatalf("%d %s, want 400 unpriced_option", resp.StatusCode, body)
			}
			if h.fake.Calls() != calls || h.runCount(u.ID) != runs {
				t.Fatalf("a refused request reached the upstream (%d → %d calls) or took a hold (%d → %d runs)",
					calls, h.fake.Calls(), runs, h.runCount(u.ID))
			}
		})
	}
	served := []struct {
		name, path, body string
		header           map[string]string
	}{
		{"default tier", chat, `{"model":"fake-gpt","service_tier":"auto","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"function tools", chat, `{"model":"fake-gpt","tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"responses function tool", responses, `{"model":"fake-gpt","tools":[{"type":"function","name":"f","parameters":{}}],"input":"hi"}`, nil},
		// The shell the caller runs itself costs tokens only.
		{"responses local shell", responses, `{"model":"fake-gpt","tools":[{"type":"shell"}],"input":"hi"}`, nil},
		{"responses local shell environment", responses, `{"model":"fake-gpt","tools":[{"type":"shell","environment":{"type":"local"}}],"input":"hi"}`, nil},
		// Images are billed by the providers as input tokens, at the text price.
		{"image input part", chat, `{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"what is it"},{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`, nil},
		// An assistant message echoed back by an SDK carries "audio": null.
		{"assistant message with a null audio", chat, `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello","audio":null},{"role":"user","content":"audio"}]}`, nil},
		{"the word input_audio in text", chat, `{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"input_audio"}]}]}`, nil},
		{"anthropic five-minute cache", messages, `{"model":"claude-test","max_tokens":50,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","ttl":"5m"}}]}]}`, nil},
		{"anthropic client tool and a token-priced beta", messages, `{"model":"claude-test","max_tokens":50,"tools":[{"name":"f","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"Anthropic-Beta": "interleaved-thinking-2025-05-14"}},
	}
	for _, tc := range served {
		t.Run("served/"+tc.name, func(t *testing.T) {
			h.postOK(t, key, tc.path, tc.body, tc.header)
		})
	}
}
