package metering

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// TestServerTaskReportOfABatchKeepsNoFigureOfAnotherTask: each llama.cpp server task of a
// /v1/completions batch reports its own prompt alone, so a figure a task's report does not give
// is not there for that task: no earlier task's figure stands in for it. A task reporting in
// the server's own shape (tokens_evaluated, tokens_predicted; no cache figure), or OpenAI-shaped
// without prompt_tokens_details, after a task whose report said its prompt cache held most of
// its prompt, had its own prompt read from the cache by that earlier count (charged at the
// cache-read price, cache reads past its prompt's size); after a task with a long prompt and
// a total, had the difference of that total and its own prompt charged as output.
func TestServerTaskReportOfABatchKeepsNoFigureOfAnotherTask(t *testing.T) {
	cached := func(index int, prompt, hit int64) Event {
		return data(strings.Replace(llamaBatchFinal(index, "", prompt, 8), `"total_tokens"`,
			fmt.Sprintf(`"prompt_tokens_details":{"cached_tokens":%d},"total_tokens"`, hit), 1))
	}
	own := func(index int, prompt, predicted int64) Event {
		return data(llamaOwnFinal(index, "", prompt, predicted, true))
	}
	for _, c := range []struct {
		name   string
		events []Event
		want   pricing.Usage
	}{{
		"own-shape report after a cached one",
		[]Event{llamaCompletionChunk(1, "bbbb"), cached(1, 210, 200), own(0, 90, 8)},
		pricing.Usage{Input: 10 + 90, CacheRead: 200, Output: 2 * 8},
	}, {
		"OpenAI-shaped report without details after a cached one",
		[]Event{llamaCompletionChunk(1, "bbbb"), llamaCompletionChunk(0, "aaaa"), cached(1, 210, 200), data(llamaBatchFinal(0, "", 90, 8)), data(`[DONE]`)},
		pricing.Usage{Input: 10 + 90, CacheRead: 200, Output: 2 * 8},
	}, {
		"cached report after an own-shape one",
		[]Event{own(0, 90, 8), llamaCompletionChunk(1, "bbbb"), cached(1, 210, 200), data(`[DONE]`)},
		pricing.Usage{Input: 90 + 10, CacheRead: 200, Output: 2 * 8},
	}, {
		"own-shape report after one with a long prompt and its total",
		[]Event{llamaCompletionChunk(1, "bbbb"), data(llamaBatchFinal(1, "", 500, 8)), own(0, 50, 8)},
		pricing.Usage{Input: 500 + 50, Output: 2 * 8},
	}} {
		got := meterBatch([]int64{100, 200}, 1, c.events...)
		if got.Usage != c.want || !got.Estimated {
			t.Errorf("%s: got %+v (estimated %v), want %+v, each task's prompt as its own report says, estimated", c.name, got.Usage, got.Estimated, c.want)
		}
	}
}
