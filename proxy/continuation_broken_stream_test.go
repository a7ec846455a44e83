package proxy_test

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestContinuedResponseChainThroughABrokenStream: an answer whose stream the upstream broke
// after it named the answer (response.created) is billed by the provider, and its context is
// carried by a continuation of it like any other's: recorded as its estimate, as a stream its
// caller left is. Recording nothing for it, the next call of the chain, cut before its usage,
// was estimated from its new turn alone and the 50 000 tokens the chain carries went uncharged.
func TestContinuedResponseChainThroughABrokenStream(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first, handed := h.answerWithContext(u.ID, key, `{"model":"fake-gpt","input":"Read this long document."}`)

	resp := h.post(key, "/v1/responses", `{"model":"fake-gpt","stream":true,"previous_response_id":"`+first+`","input":"Summarise it."}`,
		map[string]string{fakellm.HeaderChunks: "50", fakellm.HeaderDropAfter: "3"})
	answer := readAll(t, resp.Body)
	resp.Body.Close()
	var broken string
	for _, line := range strings.Split(string(answer), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && broken == "" {
			broken = gjson.Get(data, "response.id").Str
		}
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	if run := h.run(u.ID, runID); run.SettleSource.String != holds.SourceStreamError || broken == "" {
		t.Fatalf("broken call: run %+v, answer id %q; want a stream_error with its answer named (%.300s)", run, broken, answer)
	}

	_, runID = leaveAfterCreated(t, h.post(key, "/v1/responses", `{"model":"fake-gpt","stream":true,"previous_response_id":"`+broken+`","input":"Shorter."}`,
		map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"}))
	if run := h.run(u.ID, runID); !run.Estimated || run.InTok < handed {
		t.Fatalf("continuation of the broken answer: run %+v, want an estimate of at least the %d tokens the chain carries", run, handed)
	}
}
