package metering

import (
	"strings"
	"testing"
)

// TestInputEstimateCountsAFetchedPageSentBack: web_fetch (not refused: no fee of its own) puts
// the page it fetched into the answer as a web_fetch_tool_result whose content is an object (a
// web_fetch_result holding a document); sent back in the next turn it is billed as input. Only
// content arrays and strings were read, so the page was estimated at nothing.
func TestInputEstimateCountsAFetchedPageSentBack(t *testing.T) {
	page := strings.Repeat("word ", 20_000) // 100 000 bytes, ~25 000 tokens
	body := `{"model":"m","messages":[{"role":"user","content":"read it"},{"role":"assistant","content":[` +
		`{"type":"server_tool_use","id":"s","name":"web_fetch","input":{"url":"https://x"}},` +
		`{"type":"web_fetch_tool_result","tool_use_id":"s","content":{"type":"web_fetch_result","url":"https://x","retrieved_at":"2025-08-25T10:30:02Z",` +
		`"content":{"type":"document","source":{"type":"text","media_type":"text/plain","data":"` + page + `"},"title":"t"}}}]},` +
		`{"role":"user","content":"and?"}]}`
	if got := EstimateInputTokens(FormatAnthropic, []byte(body)); got < 25_000 {
		t.Errorf("estimate %d tokens for a prompt sending back a 100 KB fetched page, want ≥ 25 000", got)
	}
}
