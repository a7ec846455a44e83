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

// TestInputEstimateCountsServerToolResultsSentBack: Anthropic's server tools put what they
// found into the answer, and sent back in the next turn it is billed as input: a web search's
// results carry each page, encrypted (encrypted_content, a few KB a result), and a code
// execution's its stdout and stderr (in an object, not text blocks). Neither was read, and a
// conversation of searches was estimated at its words alone. The encrypted pages are opaque:
// their bytes stand for their tokens, as a redacted_thinking block's data's do.
func TestInputEstimateCountsServerToolResultsSentBack(t *testing.T) {
	page := strings.Repeat("x", 4_000) // ~1 000 tokens
	turn := func(blocks string) string {
		return `{"model":"m","messages":[{"role":"user","content":"look it up"},{"role":"assistant","content":[` + blocks + `]},` +
			`{"role":"user","content":"and?"}]}`
	}
	for _, tc := range []struct {
		name, blocks string
		want         int64
	}{
		{"web search", `{"type":"server_tool_use","id":"s","name":"web_search","input":{"query":"q"}},` +
			`{"type":"web_search_tool_result","tool_use_id":"s","content":[` +
			`{"type":"web_search_result","url":"https://a","title":"A","encrypted_content":"` + page + `","page_age":"1 day"},` +
			`{"type":"web_search_result","url":"https://b","title":"B","encrypted_content":"` + page + `"},` +
			`{"type":"web_search_result","url":"https://c","title":"C","encrypted_content":"` + page + `"}]}`, 3_000},
		{"code execution", `{"type":"server_tool_use","id":"s","name":"code_execution","input":{"code":"print(1)"}},` +
			`{"type":"code_execution_tool_result","tool_use_id":"s","content":{"type":"code_execution_result","stdout":"` + page + `","stderr":"` + page + `","return_code":0,"content":[]}}`, 2_000},
		{"bash code execution", `{"type":"server_tool_use","id":"s","name":"bash_code_execution","input":{"command":"ls"}},` +
			`{"type":"bash_code_execution_tool_result","tool_use_id":"s","content":{"type":"bash_code_execution_result","stdout":"` + page + `","stderr":"","return_code":0,"content":[]}}`, 1_000},
	} {
		if got := EstimateInputTokens(FormatAnthropic, []byte(turn(tc.blocks))); got < tc.want {
			t.Errorf("%s: estimate %d tokens for a prompt sending back its results, want ≥ %d", tc.name, got, tc.want)
		}
	}
}
