package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// TestSpokenAnswerSentBackEstimatedByItsLength: a conversation that sends an earlier spoken
// answer back by its id has the model hear it again, billed as audio input. The gateway saw
// that answer and knows its audio tokens; a call settled without a usage report (a caller
// who leaves before it) must be charged them. Estimated at 1 600 tokens whatever the answer's
// length, five minutes of speech (6 000 tokens) sent back were charged a quarter, at the
// audio price.
func TestSpokenAnswerSentBackEstimatedByItsLength(t *testing.T) {
	dir := t.TempDir()
	const audioTokens = 6000
	writeFixture(t, dir, "spoken_long.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":null,"audio":{"id":"audio_long","data":"`+wavSeconds(1)+`","expires_at":1,"transcript":"A long story."}},"finish_reason":"stop"}],
"usage":{"prompt_tokens":20,"completion_tokens":6010,"total_tokens":6030,"completion_tokens_details":{"audio_tokens":6000,"text_tokens":10}}}`)
	h, price := harnessRepricing(t, dir, "fake-gpt", func(m *config.ModelCfg) {
		m.AudioInput = config.USDPerM{Micro: 16 * m.Input.Micro}
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
	})
	u, key := h.user("standard")
	first, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", spokenRequest, map[string]string{fakellm.HeaderReplay: "spoken_long.json"})
	if first.OutTok < audioTokens {
		t.Fatalf("first answer out_tok %d, want the %d reported", first.OutTok, audioTokens)
	}
	h.settled() // the record of the answer is written after it ends

	again := `{"model":"fake-gpt","messages":[{"role":"user","content":"Tell me a story."},
		{"role":"assistant","audio":{"id":"audio_long"}},{"role":"user","content":"Again, slower."}]}`
	text, _ := metering.EstimatePrompt(metering.FormatChat, []byte(strings.Replace(again, `"audio":{"id":"audio_long"}`, `"content":null`, 1)))
	run := h.estimatedRun(u.ID, key, again)
	if run.InTok < text+audioTokens {
		t.Fatalf("in_tok %d, want at least %d: the text's and the sent-back answer's %d audio tokens", run.InTok, text+audioTokens, audioTokens)
	}
	if least := price.Cost(pricing.Usage{Input: text + audioTokens, AudioInput: audioTokens}); run.CostMicro < least {
		t.Fatalf("cost %d, want at least %d (%d audio tokens at the audio price)", run.CostMicro, least, audioTokens)
	}
}

// TestSpokenAnswerOfAnotherUserIsNotSentBack: every caller's spoken answers are stored under
// the operator's one account at the provider, so an audio id sent back is heard whoever made
// it: another user sending this user's answer back had the model hear it for them (and was
// estimated at the flat figure). Refused as the provider refuses an id it does not know,
// before any hold or upstream call; the answer's own user still sends it back, and an id the
// gateway has no record of (made before it, or older than a day) is forwarded.
func TestSpokenAnswerOfAnotherUserIsNotSentBack(t *testing.T) {
	dir := t.TempDir()
	writeFixture(t, dir, "spoken_mine.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":null,"audio":{"id":"audio_mine","data":"`+wavSeconds(1)+`","expires_at":1,"transcript":"Hello."}},"finish_reason":"stop"}],
"usage":{"prompt_tokens":20,"completion_tokens":60,"total_tokens":80,"completion_tokens_details":{"audio_tokens":50,"text_tokens":10}}}`)
	h, _ := harnessRepricing(t, dir, "fake-gpt", func(m *config.ModelCfg) {
		m.AudioInput = config.USDPerM{Micro: 16 * m.Input.Micro}
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
	})
	u, key := h.user("standard")
	h.answeredRun(u.ID, key, "/v1/chat/completions", spokenRequest, map[string]string{fakellm.HeaderReplay: "spoken_mine.json"})
	h.settled() // the records of the answer are written after it ends

	sendBack := func(id string) string {
		return `{"model":"fake-gpt","messages":[{"role":"user","content":"Say hello."},
			{"role":"assistant","audio":{"id":"` + id + `"}},{"role":"user","content":"Again."}]}`
	}
	other, otherKey := h.user("standard")
	h.postRefused(t, otherKey, "/v1/chat/completions", sendBack("audio_mine"), nil, http.StatusBadRequest, "audio_not_found")
	h.expectCharges(other.ID, nil)

	if run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", sendBack("audio_mine"), nil); run.State != holds.StateSettled {
		t.Fatalf("the answer's own user sending it back: run %+v, want it run and settled", run)
	}
	if run, _ := h.answeredRun(other.ID, otherKey, "/v1/chat/completions", sendBack("audio_unrecorded"), nil); run.State != holds.StateSettled {
		t.Fatalf("an id without a record: run %+v, want it forwarded", run)
	}
}
