package proxy_test

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
// answer in the 65th, which was forwarded. Every id is checked, the 65th distinct one too; a
// body sending back more distinct answers than the gateway checks is refused.
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
	// Nor past 64 distinct ids: each the caller's own short answer, so that the call is cheap
	// enough to be forwarded if the 65th goes unchecked.
	_, err := h.rdb.Pipelined(context.Background(), func(p redis.Pipeliner) error {
		for i := range padded {
			padded[i] = "audio_pad_" + strconv.Itoa(i)
			p.Set(context.Background(), h.keys.SpokenOwner(padded[i]), other.ID, time.Hour)
			p.Set(context.Background(), h.keys.SpokenAnswer(other.ID, padded[i]), 1, time.Hour)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
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
// Go's encoding/json matches "ID" (or "Id") to the audio's id, and "Audio" to the audio; the
// gateway read "id" alone, so another user's answer sent back as {"ID": …} was not checked and
// forwarded, and one under "Audio" is checked as one under "audio". An escaped key is the same
// key.
func TestSpokenAnswerOfAnotherUserByAnyKeyCaseIsNotSentBack(t *testing.T) {
	h, _, _ := spokenAnswerMade(t)

	other, otherKey := h.user("standard")
	for _, audio := range []string{`"audio":{"ID":"audio_mine"}`, `"audio":{"Id":"audio_mine"}`, `"audio":{"\u0069D":"audio_mine"}`,
		`"audio":{"id":"audio_pad","ID":"audio_mine"}`, `"Audio":{"id":"audio_mine"}`, `"AUDIO":{"ID":"audio_mine"}`} {
		body := `{"model":"fake-gpt","messages":[{"role":"user","content":"Say hello."},
			{"role":"assistant",` + audio + `},{"role":"user","content":"Again."}]}`
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

// TestSpokenAnswersOfOneCallSentBackAtTheirShare: a call asking for n spoken answers has its
// usage report the audio tokens of all of them; each answer's record is its share (their
// sum split evenly, rounded up so the shares never sum to less). Sending one back is
// estimated at its share, in place of the flat 1 600: recorded at the whole sum, one of two
// answers sent back was charged the other's audio too, and counted beside the flat figure, it
// was charged 1 600 tokens it never held.
func TestSpokenAnswersOfOneCallSentBackAtTheirShare(t *testing.T) {
	dir := t.TempDir()
	const audioTokens, share = 6001, 3001
	choice := func(i int, id string) string {
		return `{"index":` + strconv.Itoa(i) + `,"message":{"role":"assistant","content":null,"audio":{"id":"` + id + `","data":"` + wavSeconds(1) +
			`","expires_at":1,"transcript":"A long story."}},"finish_reason":"stop"}`
	}
	writeFixture(t, dir, "spoken_two.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[`+
		choice(0, "audio_one")+`,`+choice(1, "audio_two")+`],
"usage":{"prompt_tokens":20,"completion_tokens":6021,"total_tokens":6041,"completion_tokens_details":{"audio_tokens":6001,"text_tokens":20}}}`)
	h, _ := harnessRepricing(t, dir, "fake-gpt", func(m *config.ModelCfg) {
		m.AudioInput = config.USDPerM{Micro: 16 * m.Input.Micro}
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
	})
	u, key := h.user("standard")
	two := strings.Replace(spokenRequest, `"messages"`, `"n":2,"messages"`, 1)
	if first, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", two, map[string]string{fakellm.HeaderReplay: "spoken_two.json"}); first.OutTok < audioTokens {
		t.Fatalf("first answer out_tok %d, want the %d reported", first.OutTok, audioTokens)
	}
	h.settled() // the records of the answers are written after they end

	again := `{"model":"fake-gpt","messages":[{"role":"user","content":"Tell me a story."},
		{"role":"assistant","audio":{"id":"audio_two"}},{"role":"user","content":"Again, slower."}]}`
	flat, _ := metering.EstimatePrompt(metering.FormatChat, []byte(again)) // the answer at the flat figure
	run := h.estimatedRun(u.ID, key, again)
	if want := flat - metering.SentBackAnswerTokens + share; run.InTok != want {
		t.Fatalf("in_tok %d, want %d: the request's %d less the flat %d, and the answer's share %d of the call's %d audio tokens",
			run.InTok, want, flat, metering.SentBackAnswerTokens, share, audioTokens)
	}
}

// TestSpokenAnswerKeepsItsFirstUser: a spoken answer's user is recorded once, by the first
// answer to carry its id: an answer for another user that carries the same id (an upstream
// or router replaying a stored answer) does not make it theirs. Overwritten, that user could
// send the first one's answer back, and the first could no longer.
func TestSpokenAnswerKeepsItsFirstUser(t *testing.T) {
	h, u, key := spokenAnswerMade(t)
	other, otherKey := h.user("standard")
	h.answeredRun(other.ID, otherKey, "/v1/chat/completions", spokenRequest, map[string]string{fakellm.HeaderReplay: "spoken_mine.json"})
	h.settled()

	sendBack := `{"model":"fake-gpt","messages":[{"role":"user","content":"Say hello."},
		{"role":"assistant","audio":{"id":"audio_mine"}},{"role":"user","content":"Again."}]}`
	h.postRefused(t, otherKey, "/v1/chat/completions", sendBack, nil, http.StatusBadRequest, "audio_not_found")
	if run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", sendBack, nil); run.State != holds.StateSettled {
		t.Fatalf("the answer's first user sending it back: run %+v, want it run and settled", run)
	}
}

// TestSpokenAnswerRecordPastAnyCountIsReadAtTheBound: a record is a hint read back from Redis,
// taken at most at pricing.MaxTokens, so that the sum over the answers a request sends back
// cannot overflow. Read whole, two records past any count (values no answer could have
// written) wrapped the prompt's estimate past the int64 range to a few tokens: the call went
// out held and charged as a short prompt, though its records said it was beyond any credit.
// Read at the bound, it is refused 402 before anything is forwarded.
func TestSpokenAnswerRecordPastAnyCountIsReadAtTheBound(t *testing.T) {
	h, _ := audioHarness(t, "")
	u, key := h.user("standard")
	for _, id := range []string{"audio_huge_1", "audio_huge_2"} {
		if err := h.rdb.Set(context.Background(), h.keys.SpokenAnswer(u.ID, id), strconv.FormatInt(math.MaxInt64, 10), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	body := `{"model":"fake-gpt","messages":[{"role":"user","content":"Tell me a story."},
		{"role":"assistant","audio":{"id":"audio_huge_1"}},{"role":"assistant","audio":{"id":"audio_huge_2"}},{"role":"user","content":"Again."}]}`
	calls := h.fake.Calls()
	resp := h.post(key, "/v1/chat/completions", body, nil)
	out := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPaymentRequired || h.fake.Calls() != calls {
		t.Fatalf("%d %s (%d calls forwarded), want 402 and nothing forwarded: each record read at most at %d tokens",
			resp.StatusCode, out, h.fake.Calls()-calls, pricing.MaxTokens)
	}
}
