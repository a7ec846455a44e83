package fakellm

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Request headers that override Config for one request. Per-request knobs let
// one server play every upstream behaviour at once, so parallel tests need no
// server of their own.
const (
	HeaderLatency       = "X-Fake-Latency"        // Go duration before the first byte
	HeaderChunks        = "X-Fake-Chunks"         // content chunks (= output tokens before max_tokens)
	HeaderChunkInterval = "X-Fake-Chunk-Interval" // Go duration between chunks (and between replay writes)
	HeaderUsage         = "X-Fake-Usage"          // on | off | always | every-chunk
	HeaderErrorAfter    = "X-Fake-Error-After"    // in-stream error after n content chunks
	HeaderDropAfter     = "X-Fake-Drop-After"     // abort the connection after n content chunks (replay: n writes)
	HeaderStatus        = "X-Fake-Status"         // answer this 4xx/5xx status before anything else
	HeaderReplay        = "X-Fake-Replay"         // fixture base name in Config.FixturesDir
	HeaderSplit         = "X-Fake-Split"          // comma-separated byte offsets splitting the replay into writes
	HeaderPromptTokens  = "X-Fake-Prompt-Tokens"  // reported prompt tokens instead of the estimate
	HeaderLinger        = "X-Fake-Linger"         // Go duration between a stream's last event and its end
)

// maxChunks keeps a typo in a header from turning into an endless stream.
const maxChunks = 1_000_000

type usageMode uint8

const (
	usageOn         usageMode = iota // as the provider does: streams only when include_usage asks
	usageOff                         // never: the gateway must fall back to its estimate
	usageAlways                      // streams carry usage even without include_usage (some providers do)
	usageEveryChunk                  // cumulative usage on every chunk, as xAI does
)

type knobs struct {
	latency, interval time.Duration
	linger            time.Duration // after a stream's last event, before the response ends
	chunks            int
	usage             usageMode
	errorAfter        int // -1 = never
	dropAfter         int // -1 = never
	status            int // 0 = answer normally
	replay            string
	splits            []int
	promptTokens      int64 // -1 = estimate from the body
}

// parseKnobs refuses malformed values instead of ignoring them: a test whose
// knob silently did nothing would pass for the wrong reason.
func parseKnobs(h http.Header, cfg *Config) (knobs, error) {
	k := knobs{
		latency:      cfg.Latency,
		interval:     cfg.ChunkInterval,
		chunks:       cfg.Chunks,
		errorAfter:   -1,
		dropAfter:    -1,
		promptTokens: -1,
	}
	var err error
	if v := header(h, HeaderLatency); v != "" {
		if k.latency, err = parseDuration(HeaderLatency, v); err != nil {
			return k, err
		}
	}
	if v := header(h, HeaderLinger); v != "" {
		if k.linger, err = parseDuration(HeaderLinger, v); err != nil {
			return k, err
		}
	}
	if v := header(h, HeaderChunkInterval); v != "" {
		if k.interval, err = parseDuration(HeaderChunkInterval, v); err != nil {
			return k, err
		}
	}
	if v := header(h, HeaderChunks); v != "" {
		if k.chunks, err = parseCount(HeaderChunks, v, maxChunks); err != nil {
			return k, err
		}
	}
	if v := header(h, HeaderErrorAfter); v != "" {
		if k.errorAfter, err = parseCount(HeaderErrorAfter, v, maxChunks); err != nil {
			return k, err
		}
	}
	if v := header(h, HeaderDropAfter); v != "" {
		if k.dropAfter, err = parseCount(HeaderDropAfter, v, maxChunks); err != nil {
			return k, err
		}
	}
	if v := header(h, HeaderUsage); v != "" {
		switch strings.ToLower(v) {
		case "on":
			k.usage = usageOn
		case "off":
			k.usage = usageOff
		case "always":
			k.usage = usageAlways
		case "every-chunk":
			k.usage = usageEveryChunk
		default:
			return k, fmt.Errorf("%s: want on, off, always or every-chunk, got %q", HeaderUsage, v)
		}
	}
	if v := header(h, HeaderStatus); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 400 || n > 599 {
			return k, fmt.Errorf("%s: want a status in 400..599, got %q", HeaderStatus, v)
		}
		k.status = n
	}
	if v := header(h, HeaderPromptTokens); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return k, fmt.Errorf("%s: want a non-negative integer, got %q", HeaderPromptTokens, v)
		}
		k.promptTokens = n
	}
	k.replay = header(h, HeaderReplay)
	if v := header(h, HeaderSplit); v != "" {
		if k.splits, err = parseSplits(v); err != nil {
			return k, err
		}
	}
	return k, nil
}

// header reads a canonical key straight from the map: the constants above are
// canonical, and skipping canonicalisation matters at thousands of requests/s.
func header(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return strings.TrimSpace(v[0])
	}
	return ""
}

func parseDuration(name, v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s: want a non-negative Go duration such as 250ms, got %q", name, v)
	}
	return d, nil
}

func parseCount(name, v string, limit int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > limit {
		return 0, fmt.Errorf("%s: want an integer in 0..%d, got %q", name, limit, v)
	}
	return n, nil
}

// parseSplits sorts and de-duplicates, so the offsets may be given in any order.
func parseSplits(v string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s: want comma-separated non-negative byte offsets, got %q", HeaderSplit, v)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New(HeaderSplit + ": no offsets")
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
