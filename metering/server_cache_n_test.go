package metering

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// llamaUsage is a llama.cpp server's usage and timings of one task, as its builds from PR 15827
// (September 2025) to PR 19361 (February 2026) write them: the prompt tokens its KV cache held
// in timings.cache_n alone, the whole prompt in prompt_tokens. details, when not empty, is put
// into the usage (a later build's prompt_tokens_details).
func llamaUsage(prompt, cacheN, completion int64, details string) string {
	return fmt.Sprintf(`"usage":{"completion_tokens":%d,"prompt_tokens":%d,"total_tokens":%d%s},`+
		`"timings":{"cache_n":%d,"prompt_n":%d,"prompt_ms":1.5,"predicted_n":%d,"predicted_ms":3.1}`,
		completion, prompt, prompt+completion, details, cacheN, prompt-cacheN, completion)
}

// TestServerCacheNIsReadAsCachedPrompt: llama.cpp's server builds of September 2025 to February
// 2026 report the prompt tokens reused from their KV cache only as timings.cache_n, beside a
// usage whose prompt_tokens counts the whole prompt. Read as no cache figure, those tokens were
// billed at the full input price for a model with a cache-read price: a prompt of 90 tokens, 80
// of them from the cache, was billed 90 input tokens. Whole or streamed, chat or completions,
// the cache_n is the cached part of the prompt; a cached figure of the usage's own wins (the
// later builds give the same count there too), cache_n never counts above the prompt, and a
// cache_n anywhere but in an answer's timings object is no llama.cpp figure.
func TestServerCacheNIsReadAsCachedPrompt(t *testing.T) {
	chatBody := func(usage string) string {
		return `{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"hello"}}],"created":1,"model":"m",` +
			`"system_fingerprint":"b6500","object":"chat.completion",` + usage + `,"id":"chatcmpl-l"}`
	}
	chatStream := func(usage string) []string {
		return []string{
			`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"hello"}}],"created":1,"id":"chatcmpl-l","model":"m","object":"chat.completion.chunk"}`,
			`{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"chatcmpl-l","model":"m","object":"chat.completion.chunk"}`,
			`{"choices":[],"created":1,"id":"chatcmpl-l","model":"m","object":"chat.completion.chunk",` + usage + `}`,
		}
	}
	completionsStream := func(usage string) []string {
		return []string{
			`{"choices":[{"text":"hello","index":0,"logprobs":null,"finish_reason":null}],"created":1,"model":"m","object":"text_completion","id":"cmpl-l"}`,
			`{"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"m","object":"text_completion",` + usage + `,"id":"cmpl-l"}`,
		}
	}
	completionsBody := func(usage string) string {
		return `{"choices":[{"text":"hello","index":0,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"m","object":"text_completion",` + usage + `,"id":"cmpl-l"}`
	}
	cached := pricing.Usage{Input: 10, CacheRead: 80, Output: 16}
	uncached := pricing.Usage{Input: 90, Output: 16}
	for _, tc := range []struct {
		name  string
		usage string
		want  pricing.Usage
	}{
		{"cache_n alone", llamaUsage(90, 80, 16, ""), cached},
		{"cache_n and the same cached_tokens", llamaUsage(90, 80, 16, `,"prompt_tokens_details":{"cached_tokens":80}`), cached},
		{"the usage's own cached figure wins", llamaUsage(90, 80, 16, `,"prompt_tokens_details":{"cached_tokens":50}`), pricing.Usage{Input: 40, CacheRead: 50, Output: 16}},
		{"a cached figure of 0 wins", llamaUsage(90, 80, 16, `,"prompt_tokens_details":{"cached_tokens":0}`), uncached},
		{"cache_n above the prompt", llamaUsage(90, 500, 16, ""), pricing.Usage{CacheRead: 90, Output: 16}},
		{"cache_n 0", llamaUsage(90, 0, 16, ""), uncached},
		{"cache_n no number", `"usage":{"completion_tokens":16,"prompt_tokens":90,"total_tokens":106},"timings":{"cache_n":null,"predicted_n":16}`, uncached},
		{"cache_n in the usage", `"usage":{"completion_tokens":16,"prompt_tokens":90,"total_tokens":106,"cache_n":80}`, uncached},
		{"cache_n at the top", `"usage":{"completion_tokens":16,"prompt_tokens":90,"total_tokens":106},"cache_n":80`, uncached},
		{"timings no object", `"usage":{"completion_tokens":16,"prompt_tokens":90,"total_tokens":106},"timings":[{"cache_n":80}]`, uncached},
		{"no prompt_tokens", `"usage":{"completion_tokens":16,"total_tokens":106},"timings":{"cache_n":80,"predicted_n":16}`, uncached},
	} {
		for _, f := range []Format{FormatChat, FormatCompletions} {
			body, chunks := chatBody(tc.usage), chatStream(tc.usage)
			if f == FormatCompletions {
				body, chunks = completionsBody(tc.usage), completionsStream(tc.usage)
			}
			whole := NewMeter(f)
			whole.Body([]byte(body))
			if got := whole.Result(); got.Usage != tc.want || !got.Reported {
				t.Errorf("%s, format %d, whole: %+v (reported %v), want %+v", tc.name, f, got.Usage, got.Reported, tc.want)
			}
			streamed := NewMeter(f)
			for _, c := range chunks {
				streamed.Event(Event{Data: []byte(c)})
			}
			if got := streamed.Result(); got.Usage != tc.want || !got.Reported {
				t.Errorf("%s, format %d, streamed: %+v (reported %v), want %+v", tc.name, f, got.Usage, got.Reported, tc.want)
			}
		}
	}
}

// TestServerCacheNOfABatchIsEachTasksOwn: llama.cpp's server runs each prompt of a
// /v1/completions batch as a task whose report, and timings, count that prompt alone. Each
// prompt's cached part is its own task's cache_n: streamed, every task's; whole, the first
// task's, beside the other prompts at their estimate; as an array of whole answers, every
// answer's, summed. A batch is billed as its prompts sent one by one are.
func TestServerCacheNOfABatchIsEachTasksOwn(t *testing.T) {
	text := strings.Repeat("w", 64)
	final := func(index int, prompt, cacheN int64) string {
		return fmt.Sprintf(`{"choices":[{"text":"","index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"m","object":"text_completion",%s,"id":"cmpl-l"}`,
			index, llamaUsage(prompt, cacheN, 16, ""))
	}
	single := func(prompt, cacheN int64) pricing.Usage {
		m := NewMeter(FormatCompletions)
		m.Body([]byte(strings.Replace(final(0, prompt, cacheN), `"text":""`, `"text":"`+text+`"`, 1)))
		return m.Result().Usage
	}
	one, two := single(90, 80), single(210, 200)
	if one != (pricing.Usage{Input: 10, CacheRead: 80, Output: 16}) {
		t.Fatalf("a single answer: %+v, want its cache_n read from the cache", one)
	}
	sum := pricing.Usage{Input: one.Input + two.Input, CacheRead: one.CacheRead + two.CacheRead, Output: one.Output + two.Output}

	streamed := NewMeter(FormatCompletions)
	streamed.BatchPrompts([]int64{100, 200}, 1)
	for i := range 2 {
		streamed.Event(Event{Data: fmt.Appendf(nil, `{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":null}],"model":"m","object":"text_completion","id":"cmpl-l"}`, text, i)})
	}
	streamed.Event(Event{Data: []byte(final(1, 210, 200))})
	streamed.Event(Event{Data: []byte(final(0, 90, 80))})
	if got := streamed.Result(); got.Usage != sum || !got.Estimated {
		t.Errorf("streamed: %+v (estimated %v), want every task's own cache_n, %+v, estimated", got.Usage, got.Estimated, sum)
	}

	whole := NewMeter(FormatCompletions)
	whole.BatchPrompts([]int64{100, 200}, 1)
	body := strings.Replace(final(0, 90, 80), `"text":""`, `"text":"`+text+`"`, 1)
	body = strings.Replace(body, `}],"created"`, `},{"text":"`+text+`","index":1,"logprobs":null,"finish_reason":"length"}],"created"`, 1)
	whole.Body([]byte(body))
	want := pricing.Usage{Input: 10 + 200, CacheRead: 80, Output: 16 + EstimateOutputTokens(int64(len(text)))}
	if got := whole.Result(); got.Usage != want || !got.Estimated {
		t.Errorf("whole: %+v (estimated %v), want the first task's cache_n and the other prompt at its estimate, %+v, estimated", got.Usage, got.Estimated, want)
	}

	answers := NewMeter(FormatCompletions)
	answers.BatchPrompts([]int64{100, 200}, 1)
	element := func(prompt, cacheN int64) string {
		return strings.Replace(final(0, prompt, cacheN), `"text":""`, `"text":"`+text+`"`, 1)
	}
	answers.Body([]byte("[" + element(90, 80) + "," + element(210, 200) + "]"))
	if got := answers.Result(); got.Usage != sum || !got.Estimated {
		t.Errorf("array of answers: %+v (estimated %v), want every answer's own cache_n, %+v, estimated", got.Usage, got.Estimated, sum)
	}
	// Each answer's cache_n counts within its own prompt, and one in the server's own shape
	// (its builds before PR 10974, whose tokens_cached is no cache read) none.
	answers = NewMeter(FormatCompletions)
	answers.Body([]byte("[" + element(90, 500) + "," + element(210, 200) + "," +
		`{"content":"ab","stop":true,"tokens_evaluated":50,"tokens_predicted":2,"tokens_cached":52,"timings":{"cache_n":40,"predicted_n":2}}]`))
	if got, want := answers.Result().Usage, (pricing.Usage{Input: 10 + 50, CacheRead: 90 + 200, Output: 16 + 16 + 2}); got != want {
		t.Errorf("array with a cache_n above its prompt and an answer in the server's own shape: %+v, want %+v", got, want)
	}
}

// TestServerCacheNWithoutAPromptKeepsTheCachedFigure: a cache_n counts only beside the
// prompt_tokens it is part of (taskUsage). A later report of a stream that gives no prompt
// (its output alone) beside timings says nothing of the prompt's cached part: the one read
// with the prompt stands. Mutant: cache_n read without a prompt, as the cached part of a
// prompt of 0 (the 80 cached tokens of a 90 token prompt then charged at the input price).
func TestServerCacheNWithoutAPromptKeepsTheCachedFigure(t *testing.T) {
	chunks := []string{
		`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"hello"}}],"created":1,"id":"chatcmpl-l","model":"m","object":"chat.completion.chunk",` +
			llamaUsage(90, 80, 1, "") + `}`,
		`{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"chatcmpl-l","model":"m","object":"chat.completion.chunk",` +
			`"usage":{"completion_tokens":16,"total_tokens":106},"timings":{"cache_n":80,"predicted_n":16}}`,
	}
	m := NewMeter(FormatChat)
	for _, c := range chunks {
		m.Event(Event{Data: []byte(c)})
	}
	if got, want := m.Result().Usage, (pricing.Usage{Input: 10, CacheRead: 80, Output: 16}); got != want {
		t.Errorf("usage %+v, want %+v", got, want)
	}
}
