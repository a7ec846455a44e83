package proxy_test

import (
	"net/http"
	"strconv"
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
	h, u, key := spokenAnswerMade(t)

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

// TestSpokenAnswerOfAnotherUserAfterManyIsNotSentBack: the ids a body sends back are looked up
// for their estimate up to 64 of them, and only those were checked for whose answers they are:
// 64 messages sending back any other id (the caller's own answer, 64 times) hid another user's
// answer in the 65th, which was forwarded. Every id is checked; a body sending back more
// distinct answers than the gateway checks is refused.
func TestSpokenAnswerOfAnotherUserAfterManyIsNotSentBack(t *testing.T) {
	h, _, _ := spokenAnswerMade(t)

	sendBack := func(ids ...string) string {
		var b strings.Builder
		b.WriteString(`{"model":"fake-gpt","messages":[{"role":"user","content":"Say hello."}`)
		for _, id := range ids {
			b.WriteString(`,{"role":"assistant","audio":{"id":"` + id + `"}}`)
		}
		b.WriteString(`,{"role":"user","content":"Again."}]}`)
		return b.String()
	}
	padded := make([]string, 64, 65)
	for i := range padded {
		padded[i] = "audio_pad"
	}
	other, otherKey := h.user("standard")
	h.postRefused(t, otherKey, "/v1/chat/completions", sendBack(append(padded, "audio_mine")...), nil, http.StatusBadRequest, "audio_not_found")
	h.expectCharges(other.ID, nil)

	many := make([]string, 0, 1025)
	for i := range 1025 {
		many = append(many, "audio_"+strconv.Itoa(i))
	}
	h.postRefused(t, otherKey, "/v1/chat/completions", sendBack(many...), nil, http.StatusBadRequest, "too_many_audio_ids")
	// 1 024 are checked (and, estimated at 1 600 audio tokens each, cost more than a call may).
	resp := h.post(otherKey, "/v1/chat/completions", sendBack(many[:1024]...), nil)
	if out := string(readAll(t, resp.Body)); strings.Contains(out, "too_many_audio_ids") || strings.Contains(out, "audio_not_found") {
		t.Fatalf("1 024 ids without a record: %d %s, want them checked and the body not refused for them", resp.StatusCode, out)
	}
}

// TestSpokenAnswerOfAnotherUserByAnyKeyCaseIsNotSentBack: a provider or relay that decodes with
// Go's encoding/json matches "ID" (or "Id") to the audio's id, as the gateway matches "Audio"
// to audio; the gateway read "id" alone, so another user's answer sent back as {"ID": …} was
// not checked and forwarded. An escaped key is the same key.
func TestSpokenAnswerOfAnotherUserByAnyKeyCaseIsNotSentBack(t *testing.T) {
	h, _, _ := spokenAnswerMade(t)

	other, otherKey := h.user("standard")
	for _, audio := range []string{`{"ID":"audio_mine"}`, `{"Id":"audio_mine"}`, `{"\u0069D":"audio_mine"}`, `{"id":"audio_pad","ID":"audio_mine"}`} {
		body := `{"model":"fake-gpt","messages":[{"role":"user","content":"Say hello."},
			{"role":"assistant","audio":` + audio + `},{"role":"user","content":"Again."}]}`
		h.postRefused(t, otherKey, "/v1/chat/completions", body, nil, http.StatusBadRequest, "audio_not_found")
	}
	h.expectCharges(other.ID, nil)
}

// spokenAnswerMade is a gateway pricing audio in and out, on which a user (u, key) has had a
// spoken answer, "audio_mine", and its records written.
func spokenAnswerMade(t *testing.T) (h *harness, u holds.User, key string) {
	t.Helper()
	dir := t.TempDir()
	writeFixture(t, dir, "spoken_mine.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":null,"audio":{"id":"audio_mine","data":"`+wavSeconds(1)+`","expires_at":1,"transcript":"Hello."}},"finish_reason":"stop"}],
"usage":{"prompt_tokens":20,"completion_tokens":60,"total_tokens":80,"completion_tokens_details":{"audio_tokens":50,"text_tokens":10}}}`)
	h, _ = harnessRepricing(t, dir, "fake-gpt", func(m *config.ModelCfg) {
		m.AudioInput = config.USDPerM{Micro: 16 * m.Input.Micro}
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
	})
	u, key = h.user("standard")
	h.answeredRun(u.ID, key, "/v1/chat/completions", spokenRequest, map[string]string{fakellm.HeaderReplay: "spoken_mine.json"})
	h.settled() // the records of the answer are written after it ends
	return h, u, key
}
