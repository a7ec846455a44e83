package proxy_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// TestUsageThatFallsToZeroKeepsTheReport: a stream's usage reports are cumulative, the last
// final, but a report cannot count fewer tokens than nothing it had counted: a proxy that
// appends an empty usage chunk (every count 0) after the provider's real one, or a router
// whose last chunk counts the output alone with prompt_tokens 0, replaced the report whole or
// its prompt. The call was charged nothing at all, or its output alone, while the provider
// billed the prompt and the output of the report before. A 0 where an earlier report gave a
// count is no count, and the report before stands; in the Anthropic format too, where a
// second message_delta's output 0 replaced the first's final count.
func TestUsageThatFallsToZeroKeepsTheReport(t *testing.T) {
	text := strings.Repeat("word ", 160)
	chunk := func(s string) string {
		return "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\"," + s + "}\n\n"
	}
	dir := t.TempDir()
	writeFixture(t, dir, "trailing_zero.sse", chunk(`"choices":[{"index":0,"delta":{"role":"assistant","content":"`+text+`"}}]`)+
		chunk(`"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]`)+
		chunk(`"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":400,"total_tokens":1400,"prompt_tokens_details":{"cached_tokens":800}}`)+
		chunk(`"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0,"prompt_tokens_details":{"cached_tokens":0}}`)+
		"data: [DONE]\n\n")
	writeFixture(t, dir, "last_prompt_zero.sse", chunk(`"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":1000,"completion_tokens":1,"total_tokens":1001,"prompt_tokens_details":{"cached_tokens":800}}`)+
		chunk(`"choices":[{"index":0,"delta":{"content":"`+text+`"}}],"usage":null`)+
		chunk(`"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":0,"completion_tokens":400,"total_tokens":400}`)+
		"data: [DONE]\n\n")
	writeFixture(t, dir, "anth_trailing_zero.sse",
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-test\",\"content\":[],\"usage\":{\"input_tokens\":200,\"cache_read_input_tokens\":800,\"output_tokens\":1}}}\n\n"+
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\""+text+"\"}}\n\n"+
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":400}}\n\n"+
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":0}}\n\n"+
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	want := expectedUsage{Input: 200, CacheRead: 800, Output: 400}
	const ask = `"stream":true,"max_tokens":500,"messages":[{"role":"user","content":"talk"}]}`
	for _, tc := range []struct{ name, path, body, fixture string }{
		{"an empty usage chunk after the real one", "/v1/chat/completions", `{"model":"fake-gpt",` + ask, "trailing_zero.sse"},
		{"a last report with prompt_tokens 0", "/v1/chat/completions", `{"model":"fake-gpt",` + ask, "last_prompt_zero.sse"},
		{"a second message_delta of zeros", "/v1/messages", `{"model":"claude-test",` + ask, "anth_trailing_zero.sse"},
	} {
		run, _ := h.answeredRun(u.ID, key, tc.path, tc.body, map[string]string{fakellm.HeaderReplay: tc.fixture})
		got := run.Usage()
		if got.Input != want.Input || got.CacheRead != want.CacheRead || got.CacheWrite != 0 || got.Output != want.Output ||
			run.Estimated || run.CostMicro != fixtureCost(want) {
			t.Errorf("%s: settled %+v (estimated %v) at %d µUSD, want %+v at %d, as reported before the zeros",
				tc.name, got, run.Estimated, run.CostMicro, want, fixtureCost(want))
		}
	}
}

// TestTextAfterTheLastUsageOfACutStreamIsCharged: a usage report counts the output up to the
// chunk it rides on. A stream whose provider reported early (a first chunk that counts the
// prompt and no output yet, as vLLM's continuous_usage_stats and some compatible endpoints
// send) and that breaks before its final report was charged the prompt and no output at all,
// whatever text it had streamed since: less than the same stream cut without the early report,
// which is charged the estimate of that text. The provider made it and bills it; the text
// after the last report is charged at its estimate, on top of the output reported, marked
// estimated (DESIGN §7: settle what was used so far).
func TestTextAfterTheLastUsageOfACutStreamIsCharged(t *testing.T) {
	early := "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]," +
		"\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":0,\"total_tokens\":1000}}\n\n"
	text := strings.Repeat(hostileChunk, 3)
	h := hostileHarness(t, closeDelimited(t, "text/event-stream", early+text+hostileChunk[:40]), nil)
	u, key := h.user("standard")
	status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
	if status != 200 || !strings.Contains(string(answer), `"code":"upstream_broken"`) {
		t.Fatalf("status %d: %s, want the stream relayed and its break said", status, answer)
	}
	streamed := int64(3 * len("Hello billing team, here is a fairly long answer for you."))
	want := metering.EstimateOutputTokens(streamed)
	if run.SettleSource.String != holds.SourceStreamError || run.InTok != 1000 || run.OutTok != want || !run.Estimated {
		t.Errorf("run settled by %q in=%d out=%d estimated=%v, want stream_error charged the 1000 reported and %d, the estimate of the %d bytes streamed after the report, estimated",
			run.SettleSource.String, run.InTok, run.OutTok, run.Estimated, want, streamed)
	}
}

// TestAudioAfterTheLastUsageOfACutStreamIsCharged: as text, the audio a spoken answer streamed
// after an early report (a first chunk that counts the prompt and no output yet) is output no
// report counted. A stream cut before its final report was charged the early report and none
// of the audio it had spoken since: less than the same stream without the early report, which
// is charged its audio's length at the audio price (TestSpokenAnswerEstimatedByItsLength).
func TestAudioAfterTheLastUsageOfACutStreamIsCharged(t *testing.T) {
	dir := t.TempDir()
	// Three chunks of a second of 24 kHz 16-bit PCM each: 60 tokens of audio.
	second := base64.StdEncoding.EncodeToString(make([]byte, 48_000))
	chunk := func(s string) string {
		return `data: {"id":"c1","object":"chat.completion.chunk","model":"fake-gpt",` + s + "}\n\n"
	}
	fixture := chunk(`"choices":[{"index":0,"delta":{"role":"assistant","audio":{"id":"audio_1"}}}],"usage":{"prompt_tokens":20,"completion_tokens":0,"total_tokens":20}`)
	for range 3 {
		fixture += chunk(`"choices":[{"index":0,"delta":{"audio":{"data":"` + second + `"}}}],"usage":null`)
	}
	writeFixture(t, dir, "spoken_early_report.sse", fixture+`data: {"error":{"message":"overloaded","type":"server_error"}}`+"\n\n")
	h, price := spokenHarness(t, dir)
	u, key := h.user("standard")
	status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"modalities":["text","audio"],"audio":{"voice":"alloy","format":"pcm16"},
		"messages":[{"role":"user","content":"Say hello."}]}`, map[string]string{fakellm.HeaderReplay: "spoken_early_report.sse"})
	if status != http.StatusOK || !strings.Contains(string(answer), "overloaded") {
		t.Fatalf("%d %s, want the stream with its error", status, answer)
	}
	if least := price.Cost(pricing.Usage{Input: 20, Output: 60, AudioOutput: 60}); run.SettleSource.String != holds.SourceStreamError ||
		run.InTok != 20 || run.OutTok < 60 || run.CostMicro < least || !run.Estimated {
		t.Errorf("run settled by %q in=%d out=%d at %d µUSD (estimated %v), want stream_error charged the 20 reported and at least the 60 tokens of the 3 seconds spoken after the report, at least %d µUSD, estimated",
			run.SettleSource.String, run.InTok, run.OutTok, run.CostMicro, run.Estimated, least)
	}
}

// TestUsageOfZerosIsNoReport: a usage whose every figure is 0 counts nothing the call used: a
// compatible server or relay that puts such a placeholder in each chunk until its real report
// (usage {0, 0, 0} beside the text) had a stream cut before that report charged nothing at
// all, its prompt and its text at 0, where the same stream without the placeholders is charged
// their estimates; after an early report of the prompt, a placeholder hid the text streamed
// before it from TestTextAfterTheLastUsageOfACutStreamIsCharged's estimate. It is no report:
// the call is charged as the same stream without it.
func TestUsageOfZerosIsNoReport(t *testing.T) {
	const text = "Hello billing team, here is a fairly long answer for you."
	zeros := `,"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}`
	chunk := func(s string) string {
		return "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\"," + s + "}\n\n"
	}
	stream := func(first, usage string) string {
		s := chunk(`"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]` + first)
		for range 3 {
			s += chunk(`"choices":[{"index":0,"delta":{"content":"` + text + `"}}]` + usage)
		}
		return s + `data: {"error":{"message":"overloaded","type":"server_error"}}` + "\n\n"
	}
	early := `,"usage":{"prompt_tokens":1000,"completion_tokens":0,"total_tokens":1000}`
	dir := t.TempDir()
	writeFixture(t, dir, "plain.sse", stream("", ""))
	writeFixture(t, dir, "zeros.sse", stream(zeros, zeros))
	writeFixture(t, dir, "early.sse", stream(early, ""))
	writeFixture(t, dir, "early_then_zeros.sse", stream(early, zeros))
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	const body = `{"model":"fake-gpt","stream":true,"max_tokens":500,"messages":[{"role":"user","content":"talk"}]}`
	settled := func(fixture string) holds.Run {
		t.Helper()
		status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderReplay: fixture})
		if status != http.StatusOK || !strings.Contains(string(answer), "overloaded") {
			t.Fatalf("%s: %d %s, want the stream with its error", fixture, status, answer)
		}
		return run
	}
	for _, tc := range []struct{ name, fixture, like string }{
		{"a placeholder of zeros in every chunk", "zeros.sse", "plain.sse"},
		{"placeholders of zeros after an early report", "early_then_zeros.sse", "early.sse"},
	} {
		want, got := settled(tc.like), settled(tc.fixture)
		if got.SettleSource.String != holds.SourceStreamError || got.InTok != want.InTok || got.OutTok != want.OutTok ||
			got.CostMicro != want.CostMicro || !got.Estimated || want.OutTok == 0 {
			t.Errorf("%s: settled by %q in=%d out=%d at %d µUSD (estimated %v), want as the same stream without them: in=%d out=%d at %d µUSD, estimated",
				tc.name, got.SettleSource.String, got.InTok, got.OutTok, got.CostMicro, got.Estimated, want.InTok, want.OutTok, want.CostMicro)
		}
	}
}

// TestAnthropicStartOfZerosIsNoReport: Anthropic's message_start counts the prompt; the shims
// that serve other models in Anthropic's format open their streams with a message_start whose
// usage is a placeholder of zeros ({"input_tokens":0,"output_tokens":0}) and count the call in
// message_delta. A stream of theirs cut before message_delta had its prompt charged at 0, where
// the same stream with a message_start without a usage is charged the prompt's estimate.
func TestAnthropicStartOfZerosIsNoReport(t *testing.T) {
	text := strings.Repeat("word ", 160)
	stream := func(usage string) string {
		return "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-test\",\"content\":[]" + usage + "}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + text + "\"}}\n\n" +
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	}
	dir := t.TempDir()
	writeFixture(t, dir, "anth_plain.sse", stream(""))
	writeFixture(t, dir, "anth_zeros.sse", stream(`,"usage":{"input_tokens":0,"output_tokens":0}`))
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	const body = `{"model":"claude-test","stream":true,"max_tokens":500,"messages":[{"role":"user","content":"talk to me at length about billing"}]}`
	settled := func(fixture string) holds.Run {
		t.Helper()
		status, answer, run := h.postRun(u.ID, key, "/v1/messages", body, map[string]string{fakellm.HeaderReplay: fixture})
		if status != http.StatusOK || !strings.Contains(string(answer), "overloaded_error") {
			t.Fatalf("%s: %d %s, want the stream with its error", fixture, status, answer)
		}
		return run
	}
	want, got := settled("anth_plain.sse"), settled("anth_zeros.sse")
	if got.SettleSource.String != holds.SourceStreamError || got.InTok != want.InTok || got.OutTok != want.OutTok ||
		got.CostMicro != want.CostMicro || !got.Estimated || want.InTok == 0 {
		t.Errorf("settled by %q in=%d out=%d at %d µUSD (estimated %v), want as the same stream without the placeholder: in=%d out=%d at %d µUSD, estimated",
			got.SettleSource.String, got.InTok, got.OutTok, got.CostMicro, got.Estimated, want.InTok, want.OutTok, want.CostMicro)
	}
}

// TestAnthropicUsageOfZerosIsNoReport: a shim serving another model in Anthropic's format that
// counts nothing sends usages of zeros all through (message_start, message_delta, a whole
// body's). Read as reports, the whole answer was charged 0, prompt and output, and not marked
// estimated. A usage of zeros is none: the answer is charged as the same one without usages,
// at its estimate.
func TestAnthropicUsageOfZerosIsNoReport(t *testing.T) {
	text := strings.Repeat("word ", 160)
	stream := func(usage string) string {
		return "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-test\",\"content\":[]" + usage + "}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + text + "\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}" + strings.Replace(usage, `"input_tokens":0,`, "", 1) + "}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	}
	whole := func(usage string) string {
		return `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"` + text + `"}],"stop_reason":"end_turn"` + usage + `}`
	}
	const zeros = `,"usage":{"input_tokens":0,"output_tokens":0}`
	dir := t.TempDir()
	writeFixture(t, dir, "anth_stream_plain.sse", stream(""))
	writeFixture(t, dir, "anth_stream_zeros.sse", stream(zeros))
	writeFixture(t, dir, "anth_whole_plain.json", whole(""))
	writeFixture(t, dir, "anth_whole_zeros.json", whole(zeros))
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	settled := func(fixture string, streamed bool) holds.Run {
		t.Helper()
		body := fmt.Sprintf(`{"model":"claude-test","stream":%v,"max_tokens":500,"messages":[{"role":"user","content":"talk to me at length about billing"}]}`, streamed)
		status, answer, run := h.postRun(u.ID, key, "/v1/messages", body, map[string]string{fakellm.HeaderReplay: fixture})
		if status != http.StatusOK || !strings.Contains(string(answer), "word word") {
			t.Fatalf("%s: %d %s, want the answer", fixture, status, answer)
		}
		return run
	}
	for _, tc := range []struct {
		plain, zeros string
		streamed     bool
	}{{"anth_stream_plain.sse", "anth_stream_zeros.sse", true}, {"anth_whole_plain.json", "anth_whole_zeros.json", false}} {
		want, got := settled(tc.plain, tc.streamed), settled(tc.zeros, tc.streamed)
		if got.InTok != want.InTok || got.OutTok != want.OutTok || got.CostMicro != want.CostMicro || !got.Estimated || want.InTok == 0 || want.OutTok == 0 {
			t.Errorf("%s: in=%d out=%d at %d µUSD (estimated %v), want as %s: in=%d out=%d at %d µUSD, estimated",
				tc.zeros, got.InTok, got.OutTok, got.CostMicro, got.Estimated, tc.plain, want.InTok, want.OutTok, want.CostMicro)
		}
	}
}
