package proxy_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
)

// vllmReasoningChunk is a chat chunk as vLLM streams a reasoning model's thinking: its
// DeltaMessage copies reasoning into the deprecated reasoning_content
// (handle_deprecated_reasoning_content), so every delta carries the same text twice.
func vllmReasoningChunk(text string) string {
	return `data: {"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":{"reasoning":"` + text +
		`","reasoning_content":"` + text + `"},"finish_reason":null}]}` + "\n\n"
}

// TestReasoningGivenTwiceIsCountedOnce: a stream cut before its usage is charged the estimate of
// the output streamed. A delta that gives its reasoning under both names (vLLM's, and a router's
// passing them on) carries one text, which the model wrote once — as a prompt's estimate reads
// a message that gives both — but the meter counted it under each name, and the caller paid for
// the thinking twice.
func TestReasoningGivenTwiceIsCountedOnce(t *testing.T) {
	think := strings.Repeat("Let me work through the invoice line by line. ", 5) // 230 bytes
	var whole strings.Builder
	for range 8 {
		whole.WriteString(vllmReasoningChunk(think))
	}
	whole.WriteString(hostileChunk)
	streamed := int64(8*len(think)) + int64(len("Hello billing team, here is a fairly long answer for you."))
	want := metering.EstimateOutputTokens(streamed)
	h := hostileHarness(t, closeDelimited(t, "text/event-stream", whole.String()+hostileChunk[:40]), nil)
	u, key := h.user("standard")
	status, got, run := h.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
	t.Logf("status %d, %d bytes to the caller; run in=%d out=%d est=%v src=%s charged=%d µUSD",
		status, len(got), run.InTok, run.OutTok, run.Estimated, run.SettleSource.String, run.ChargedMicro)
	if status != 200 || !strings.HasPrefix(string(got), whole.String()) {
		t.Fatalf("the caller did not get the stream's whole events: status %d", status)
	}
	if run.SettleSource.String != holds.SourceStreamError || !run.Estimated || run.OutTok != want {
		t.Fatalf("the caller got %d bytes of the model's words (an estimate of %d tokens); run settled %s out=%d estimated=%v: "+
			"want stream_error charged %d output tokens, the reasoning once", streamed, want, run.SettleSource.String, run.OutTok,
			run.Estimated, want)
	}
}
