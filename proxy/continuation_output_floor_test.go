package proxy_test

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestContinuedResponseCarriesItsOutputWhenToolsOutweighThePrompt: what an answer hands on is
// its reported prompt less its request's tools (sent again by a continuation), never less than
// nothing, plus its output. A request whose tools the gateway estimates above the prompt the
// provider reported still hands on its whole output: taking the surplus off the output, the
// answer's 2 000 tokens of output were recorded as nothing, and a continuation cut before its
// usage was estimated from its new turn alone.
func TestContinuedResponseCarriesItsOutputWhenToolsOutweighThePrompt(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	tools := `[{"type":"function","name":"lookup","description":"` + strings.Repeat("a", 40_000) +
		`","parameters":{"type":"object","properties":{}}}]` // about 10 000 tokens by the estimate
	first, answer := h.answeredRun(u.ID, key, "/v1/responses", `{"model":"fake-gpt","tools":`+tools+`,"input":"Write at length."}`,
		map[string]string{fakellm.HeaderPromptTokens: "100", fakellm.HeaderChunks: "2000"})
	if first.OutTok < 2000 {
		t.Fatalf("first answer %+v: want its 2 000 tokens of output", first)
	}
	next := `{"model":"fake-gpt","stream":true,"previous_response_id":"` + gjson.GetBytes(answer, "id").Str + `","input":"Go on."}`
	_, runID := leaveAfterCreated(t, h.post(key, "/v1/responses", next,
		map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"}))
	if run := h.run(u.ID, runID); !run.Estimated || run.InTok < first.OutTok {
		t.Fatalf("continuation %+v: want an estimate of at least the %d tokens of output handed on", run, first.OutTok)
	}
}
