package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
)

// TestOversizedMislabelledStreamIsMeteredByItsEvents: a streamed call answered with its event
// stream under another label (application/json) is read as a whole answer; relayed whole, its
// events are metered, and without a usage report its output is estimated from their text. Too
// large to relay, it was read past as JSON, found to be no object, and charged its prompt's
// estimate alone: the longer the answer, the less it cost. It is metered by its events now,
// read to its end or cut at the read bound (four times max_response_bytes, past its head), as
// the same stream relayed whole, or cut there, is.
func TestOversizedMislabelledStreamIsMeteredByItsEvents(t *testing.T) {
	const limit = 64 << 10
	const text = "Hello billing team, here is a fairly long answer for you."
	chunk := `data: {"id":"x","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":{"content":"` + text + `"}}]}` + "\n\n"
	stream := func(chunks int) string { return strings.Repeat(chunk, chunks) + "data: [DONE]\n\n" }
	up := &fixedUpstream{} // labels every answer application/json
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	gateway := func(max int64) *harness {
		return newHarness(t, func(c *config.Config) {
			c.Upstreams = []config.Upstream{{Name: "fixed", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
			c.Plans["standard"] = bigPlan(c.Plans["standard"])
			c.Limits.MaxResponseBytes = max
		})
	}
	relayed, tooLarge := gateway(32<<20), gateway(limit)
	// Read whole: the stream ends within what is read past the limit.
	short := 2 * limit / len(chunk)
	// Cut at the bound: what is read in all is its head (limit+1 bytes read as it came, or the
	// first 64 KiB read for its Content-Length) and four times the limit past it.
	long := 8 * limit / len(chunk)
	seen := func(n int) int64 { return metering.EstimateOutputTokens(int64(n / len(chunk) * len(text))) }
	for _, tc := range []struct {
		name              string
		h                 *harness
		chunks            int
		status            int
		leastOut, mostOut int64
	}{
		{"relayed whole", relayed, short, http.StatusOK, seen(short * len(chunk)), seen(short * len(chunk))},
		{"too large, read to its end", tooLarge, short, http.StatusBadGateway, seen(short * len(chunk)), seen(short * len(chunk))},
		{"too large, cut at the bound", tooLarge, long, http.StatusBadGateway, seen(5*limit) - 1, seen(5*limit + 1)},
	} {
		for _, length := range []bool{false, true} {
			name := fmt.Sprintf("%s (Content-Length %v)", tc.name, length)
			up.set(stream(tc.chunks), length)
			u, key := tc.h.user("standard")
			status, answer, run := tc.h.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
			if status != tc.status {
				t.Fatalf("%s: %d %.200s, want %d", name, status, answer, tc.status)
			}
			if status != http.StatusOK && errorCode(t, answer) != "upstream_response_too_large" {
				t.Fatalf("%s: %.200s, want upstream_response_too_large", name, answer)
			}
			if !run.Estimated || run.OutTok < tc.leastOut || run.OutTok > tc.mostOut {
				t.Errorf("%s: run settled %s, estimated=%v, %d output tokens; want the text of its events estimated, %d to %d",
					name, run.SettleSource.String, run.Estimated, run.OutTok, tc.leastOut, tc.mostOut)
			}
			if tc.status != http.StatusOK && run.SettleSource.String != holds.SourceStreamError {
				t.Errorf("%s: settled %s, want stream_error", name, run.SettleSource.String)
			}
		}
	}

	// Broken on the way, within its head or past it: the output its whole events hold, as a
	// relayable one broken is charged (meterCut).
	cut := &cutUpstream{}
	cutTS := httptest.NewServer(cut)
	t.Cleanup(cutTS.Close)
	broken := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "cut", Kind: "openai", BaseURL: cutTS.URL, Models: []string{"*"}}}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
		c.Limits.MaxResponseBytes = limit
	})
	for _, tc := range []struct {
		send     int
		delivery string
		code     string
	}{
		{40_000, "length", "upstream_broken"},                // within the head read for its Content-Length
		{3 * limit, "length", "upstream_response_too_large"}, // past it
		{3 * limit, "chunked", "upstream_response_too_large"},
	} {
		name := fmt.Sprintf("broken after %d bytes (%s)", tc.send, tc.delivery)
		cut.set(stream(long), tc.send, tc.delivery)
		u, key := broken.user("standard")
		status, answer, run := broken.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
		if status != http.StatusBadGateway || errorCode(t, answer) != tc.code {
			t.Fatalf("%s: %d %.200s, want 502 %s", name, status, answer, tc.code)
		}
		if want := seen(tc.send); !run.Estimated || run.OutTok != want || run.SettleSource.String != holds.SourceStreamError {
			t.Errorf("%s: run settled %s, estimated=%v, %d output tokens; want stream_error, the text of its whole events estimated, %d",
				name, run.SettleSource.String, run.Estimated, run.OutTok, want)
		}
	}
}
