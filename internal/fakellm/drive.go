package fakellm

import (
	"context"
	"errors"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
)

// createdStr is the fixed creation time (Unix seconds) of every answer: with it
// and ids derived from the body, the same request gets the same bytes, so tests
// may compare whole responses (an idempotent replay by the gateway, say).
const createdStr = "1700000000"

// gen is what every route's answer is computed from.
type gen struct {
	id           string // route prefix + hash of the body
	model        string // a JSON string literal, copied from the request
	prompt       int64  // prompt tokens reported
	n            int64  // output tokens = content chunks
	capped       bool   // n was cut by the request's limit: finish "length"
	usage        usageMode
	includeUsage bool // stream_options.include_usage
}

func (g *gen) tokens() int64 { return g.n }

// answer is one route's response format.
type answer interface {
	tokens() int64
	// whole appends the non-streaming response body.
	whole(b []byte) []byte
}

// streamAnswer is a response format that can also stream. The driver owns
// pacing and failure injection, so each format only says what its events are.
type streamAnswer interface {
	answer
	head(e *emitter)             // events before the first content chunk
	delta(e *emitter, i int64)   // content chunk i (1-based)
	tail(e *emitter)             // events after the last content chunk
	fail(e *emitter, sent int64) // the in-stream error after sent chunks
}

// newAnswer parses the body once into what the route's answer needs.
func newAnswer(rt route, body []byte, k *knobs) (answer, bool, error) {
	if !gjson.ValidBytes(body) {
		return nil, false, errors.New("request body is not valid JSON")
	}
	root := gjson.ParseBytes(body)
	g := gen{
		model:        `"fake-model"`,
		prompt:       k.promptTokens,
		n:            int64(k.chunks),
		usage:        k.usage,
		includeUsage: root.Get("stream_options.include_usage").Bool(),
	}
	if m := root.Get("model"); m.Type == gjson.String {
		g.model = m.Raw
	}
	if g.prompt < 0 {
		g.prompt = PromptTokens(body)
	}
	lim, err := outputLimit(root)
	if err != nil {
		return nil, false, err
	}
	if lim >= 0 && lim < g.n {
		g.n, g.capped = lim, true
	}
	h := fnv.New64a()
	_, _ = h.Write(body)
	sum := strconv.AppendUint(nil, h.Sum64(), 36)
	stream := root.Get("stream").Bool()
	switch rt {
	case routeChat:
		g.id = "chatcmpl-fake" + string(sum)
		return newChat(g, false), stream, nil
	case routeCompletions:
		g.id = "cmpl-fake" + string(sum)
		return newChat(g, true), stream, nil
	case routeResponses:
		g.id = "resp_fake" + string(sum)
		return &responses{gen: g, itemID: "msg_fake" + string(sum)}, stream, nil
	case routeMessages:
		g.id = "msg_fake" + string(sum)
		return &messages{gen: g}, stream, nil
	default:
		g.n = 0
		return newEmbeddings(g, root, h.Sum64()), false, nil
	}
}

// emitter writes events and flushes each one, because a stream's events must
// reach the gateway when they are produced, not when a buffer fills. After the
// first failed write (the client is gone) it does nothing.
type emitter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	b  []byte // the event being built
	ok bool
}

// flush sends the event built in e.b.
func (e *emitter) flush() bool {
	ok := e.write(e.b)
	e.b = e.b[:0]
	return ok
}

func (e *emitter) write(p []byte) bool {
	if !e.ok {
		return false
	}
	if len(p) > 0 {
		if _, err := e.w.Write(p); err != nil {
			e.ok = false
			return false
		}
	}
	if err := e.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		e.ok = false
	}
	return e.ok
}

type ending uint8

const (
	endNormal ending = iota
	endError
	endDrop
)

// plan says after how many content chunks the answer ends, and how: the
// earlier of X-Fake-Error-After and X-Fake-Drop-After wins, an error on a tie;
// counts past the answer's length take effect after its last chunk.
func plan(k *knobs, n int64) (int64, ending) {
	stop, end := n, endNormal
	if k.errorAfter >= 0 {
		stop, end = min(int64(k.errorAfter), n), endError
	}
	if k.dropAfter >= 0 && (end == endNormal || int64(k.dropAfter) < stop) {
		stop, end = min(int64(k.dropAfter), n), endDrop
	}
	return stop, end
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, k *knobs, a streamAnswer, buf []byte) []byte {
	ctx := r.Context()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	e := &emitter{w: w, rc: http.NewResponseController(w), b: buf[:0], ok: true}

	n := a.tokens()
	stop, end := plan(k, n)
	if a.head(e); !e.ok {
		return e.b
	}
	for i := int64(1); i <= stop; i++ {
		if i > 1 && !sleep(ctx, k.interval) {
			return e.b
		}
		if a.delta(e, i); !e.ok {
			return e.b
		}
	}
	// A failure cut short takes the place of the next chunk, and its time.
	if end != endNormal && stop > 0 && stop < n && !sleep(ctx, k.interval) {
		return e.b
	}
	switch end {
	case endError:
		a.fail(e, stop)
	case endDrop:
		// Aborting the handler makes net/http close the connection without
		// the terminating chunk (HTTP/1.1) or reset the stream (HTTP/2):
		// what a crashed provider looks like.
		panic(http.ErrAbortHandler)
	default:
		a.tail(e)
	}
	return e.b
}

// whole answers without streaming, after as long as streaming the same answer
// would have taken, so cancel and timeout tests work on both paths.
func (s *Server) whole(w http.ResponseWriter, r *http.Request, k *knobs, a answer, anth bool, buf []byte) []byte {
	n := a.tokens()
	if n > 1 && !sleep(r.Context(), mulDuration(k.interval, n-1)) {
		return buf
	}
	switch _, end := plan(k, n); end {
	case endError:
		writeError(w, http.StatusInternalServerError, anth, statusType(500, anth), "fake upstream error")
		return buf
	case endDrop:
		panic(http.ErrAbortHandler)
	}
	b := a.whole(buf[:0])
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return b
}

func mulDuration(d time.Duration, n int64) time.Duration {
	if d > 0 && n > int64(math.MaxInt64/d) {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}

// sleep pauses unless the client leaves first: a client that hangs up must
// free its handler at once, or a cancel storm in a benchmark would pile up
// sleeping goroutines. It reports whether to go on.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Helpers shared by the formats.

func appendWord(b []byte, i int64) []byte {
	b = append(b, "tok"...)
	b = strconv.AppendInt(b, i, 10)
	return append(b, ' ')
}

// appendText appends the whole answer: "tok1 tok2 ... tokN ".
func appendText(b []byte, n int64) []byte {
	for i := int64(1); i <= n; i++ {
		b = appendWord(b, i)
	}
	return b
}

func appendInt(b []byte, n int64) []byte { return strconv.AppendInt(b, n, 10) }
