package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fixtures"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/metering/runstate"
)

// relayFuzz is what every run of FuzzRelayStream shares: a configuration with priced models,
// the metrics, and a tally and store on the test's MariaDB and Redis, which a named run's call
// writes to before the end of its answer goes out.
type relayFuzz struct {
	cfg     *config.Config
	metrics *Metrics
	tally   *runstate.Tally
	keys    runstate.Keys
	store   *holds.Store
	server  func(limit int) *Server
}

func newRelayFuzz(tb testing.TB) *relayFuzz {
	tb.Helper()
	cfg := config.Default()
	prices, err := cfg.PriceTable()
	if err != nil {
		tb.Fatal(err)
	}
	rdb, prefix := testenv.Redis(tb)
	rf := &relayFuzz{cfg: cfg, metrics: NewMetrics(nil), keys: runstate.Keys{Prefix: prefix}}
	rf.tally = runstate.NewTally(rdb, rf.keys, cfg.Holds.TallyTTL)
	rf.store = holds.NewStore(testenv.MySQL(tb), plans.FromConfig(cfg), cfg.DefaultPlan, zap.NewNop())
	rf.server = func(limit int) *Server {
		c := *cfg
		c.Limits.MaxEventBytes = limit
		return &Server{cfg: &c, prices: prices, metrics: rf.metrics, log: zap.NewNop(), tally: rf.tally,
			keys: rf.keys, store: rf.store, dedupRDB: rdb}
	}
	return rf
}

// relayRoutes are the streamed routes, by the two bits of a fuzz input that pick one.
var relayRoutes = [4]*route{routes[0], routes[1], routes[3], routes[4]}

// relaySeeds are the recorded streams, each cut to its first and last events (a seed of a few
// KiB; the fuzzer grows what it needs), with the route they were recorded on.
func relaySeeds(tb testing.TB) (seeds [][]byte, routeBits []uint8) {
	tb.Helper()
	dir := fixtures.Dir(tb)
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".sse") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			tb.Fatal(err)
		}
		var bits uint8
		switch {
		case strings.HasPrefix(name, "anthropic_"):
			bits = 3
		case strings.Contains(name, "_responses_"):
			bits = 2
		case strings.Contains(name, "_completions_"):
			bits = 1
		}
		seeds, routeBits = append(seeds, seedHeadAndTail(data, 1024)), append(routeBits, bits)
	}
	return seeds, routeBits
}

// seedHeadAndTail keeps the events of stream that start within its first n bytes or its last n.
func seedHeadAndTail(stream []byte, n int) []byte {
	if len(stream) <= 2*n {
		return stream
	}
	var out []byte
	at := 0
	for _, ev := range bytes.SplitAfter(stream, []byte("\n\n")) {
		if at < n || at >= len(stream)-n {
			out = append(out, ev...)
		}
		at += len(ev)
	}
	return out
}

// Bits of FuzzRelayStream's mode.
const (
	relayRouteBits  = 3      // which route (relayRoutes)
	relayAsked      = 1 << 2 // the caller asked for the usage chunk itself
	relayEndShift   = 3      // 2 bits: how the upstream's body ends (relayEnds)
	relayInRun      = 1 << 5 // a call of a named run
	relaySmallLimit = 1 << 6 // limits.max_event_bytes is the fuzzed limit, not 1 MiB
	relayCallerGone = 1 << 7 // the caller's writes fail after the fuzzed limit's bytes
)

// relayEnds are how the upstream's body may end: cleanly, or broken in the ways net/http
// reports (a reset, a chunked body cut short, a timeout).
var relayEnds = [4]error{io.EOF, errors.New("read: connection reset by peer"), io.ErrUnexpectedEOF,
	timeoutError("read: i/o timeout")}

// FuzzRelayStream streams any bytes, cut into any reads and ending in any way, through
// relayStream on every streamed route, for a plain call and a named run's, and checks what
// the caller receives and what the call is metered against what the README promises of the
// same bytes read whole:
//
//   - the caller gets every event the upstream sent, in order and byte for byte, but for the
//     usage-only chunk the gateway asked for on the caller's behalf, and for a half event left
//     by a break; nothing of the gateway's own follows the stream's final event;
//   - a stream that breaks (or sends an event over limits.max_event_bytes) before its final
//     event ends with one error event in its format, upstream_broken or upstream_timeout,
//     unless the provider's own error event ended the answer before: it ends as that error;
//   - the call is metered what metering.NewMeter reads of the same bytes whole, and a named
//     run's tally says what its settlement would;
//   - what is read of an upstream that sends an event over the limit, and what a named run
//     holds after its final event, stays within the limit (plus a read, plus an event).
func FuzzRelayStream(f *testing.F) {
	rf := newRelayFuzz(f)
	seeds, bits := relaySeeds(f)
	for i, s := range seeds {
		f.Add(s, []byte{7, 0, 13, 1, 63, 2, 5}, bits[i], uint16(0))
		f.Add(s, []byte{40, 3}, bits[i]|relayInRun|1<<relayEndShift, uint16(0))
	}
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\r\n\r\ndata: [DONE]\r\n\r\n"), []byte{49}, uint8(0), uint16(0))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":"), []byte{20}, uint8(2<<relayEndShift), uint16(0))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"th"), []byte{}, uint8(0), uint16(0))
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\r\r\ndata: [DONE]\n\n"), []byte{50}, uint8(0), uint16(0))
	f.Add([]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\ndata: after\n\n"), []byte{}, uint8(3|relayInRun|relaySmallLimit), uint16(12))
	f.Add([]byte(""), []byte{}, uint8(0), uint16(0))
	f.Add([]byte(": OPENROUTER PROCESSING\n\n: OPENROUTER PROCESSING\n\n"), []byte{5}, uint8(relayInRun), uint16(0))
	// Keep-alives alone, the last cut before its line ending: the half comment is not passed on,
	// nor the gateway's error event written on its line.
	f.Add([]byte(": OPENROUTER PROCESSING\n\n: OPENROUTER PROCESSING"), []byte{30}, uint8(0), uint16(0))
	// An Anthropic stream that ends cleanly before message_stop, inside its last event (whole
	// but for its blank line): a break, the error event after a blank line that ends that event.
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n"+
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n"),
		[]byte{40}, uint8(3), uint16(0))
	f.Fuzz(func(t *testing.T, in, cuts []byte, mode uint8, lim uint16) {
		rt := relayRoutes[mode&relayRouteBits]
		limit := 1 << 20
		if mode&relaySmallLimit != 0 {
			limit = int(lim%4096) + 1
		}
		end := relayEnds[mode>>relayEndShift&3]
		strip := rt.injectUsage && mode&relayAsked == 0
		inRun := mode&relayInRun != 0
		callerGone := mode&relayCallerGone != 0

		want := expectRelay(in, rt.format, strip, end, limit, inRun)

		s := rf.server(limit)
		price, key, err := s.prices.Lookup("fake-gpt")
		if err != nil {
			t.Fatal(err)
		}
		c := &call{req: &callRequest{route: rt, stream: true, model: "fake-gpt", priceKey: key,
			clientAskedUsage: mode&relayAsked != 0, price: price, upstream: &config.Upstream{Name: "fake"}},
			meter: metering.NewMeter(rt.format), log: zap.NewNop(), runID: "r_" + testenv.RandomID(8), inRun: inRun}
		if inRun {
			c.callID = token.New() // as the call's creation names a named run's call
		} else {
			c.fpKey = rf.keys.Dedup(1, testenv.RandomID(8))
		}
		body := &countingReader{r: &cutReader{rest: bytes.Clone(in), cuts: cuts, end: end}}
		resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
			Body: io.NopCloser(body)}
		w := &relayRecorder{ResponseRecorder: httptest.NewRecorder(), room: -1}
		if callerGone {
			w.room = int(lim)
		}
		r := httptest.NewRequest(http.MethodPost, rt.path, nil)
		stopped := false
		status := s.relayStream(w, r, resp, c, func() { stopped = true })
		if status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
		got := w.Body.Bytes()
		if callerGone {
			// The caller left: what it got is a start of what it would have got.
			if !bytes.HasPrefix(want.out, got) && !bytes.HasPrefix(withoutLeadLF(want), got) {
				t.Fatalf("a caller that left got %q\nnot a start of %q", got, want.out)
			}
			return
		}
		if want.tooLarge >= 0 && !bytes.Equal(got, want.out) {
			// An event whose blank line is a CRLF cut between its CR and LF by a read is handed
			// on at the CR (metering.Scanner): it fits a limit one byte under its whole size,
			// and its LF, leading the next event, goes with that event (dropped with it when
			// it is a half event after a break). A CR alone ends a line as a CRLF does, so
			// the caller reads the same events.
			crlf := []byte("\r\n")
			alt := expectRelay(in, rt.format, strip, end, limit+1, inRun)
			if bytes.Equal(bytes.ReplaceAll(got, crlf, crlf[:1]), bytes.ReplaceAll(alt.out, crlf, crlf[:1])) {
				want, got = alt, alt.out
			}
		}
		if !bytes.Equal(got, want.out) && leadLFDropped(got, want) {
			// The same CRLF cut at its CR by a read, just before a break: its LF was all of
			// the half event the break left, not passed on.
			got = want.out
		}
		if !bytes.Equal(got, want.out) {
			t.Fatalf("caller got  %q\nwant        %q\n(input %q, cuts %v)", got, want.out, in, cuts)
		}
		if res := c.meter.Result(); !reflect.DeepEqual(res, want.meter.Result()) {
			t.Fatalf("metered %+v\nread whole %+v", res, want.meter.Result())
		}
		if wantOutcome := want.outcome(); c.outcome != wantOutcome {
			t.Fatalf("outcome %v, want %v", c.outcome, wantOutcome)
		}
		if want.tooLarge >= 0 && body.n > want.tooLarge+limit+minScannerRead+1 {
			t.Fatalf("read %d bytes of an upstream whose event at %d passes the %d-byte limit", body.n, want.tooLarge, limit)
		}
		if want.cutHeld && !stopped {
			t.Fatal("a named run's upstream that went on past its final event was not cut")
		}
		if inRun {
			tallied, found, err := rf.tally.Get(context.Background(), c.runID)
			if err != nil {
				t.Fatal(err)
			}
			// Tallied before the caller has the end of its answer: its final event or the
			// provider's error event (and what came after it), or the error event of a break.
			// Any other end is tallied when the call ends, before the handler returns (finish).
			if mustTally := want.final || want.sawErr || want.broke; mustTally != found {
				t.Fatalf("tallied %v before the end of the answer went out, want %v", found, mustTally)
			}
			if st := s.settlementOf(c); found && (tallied.Usage != st.Usage || tallied.CostMicro != st.CostMicro) {
				t.Fatalf("tally %+v, settlement %+v", tallied, st)
			}
		}
	})
}

// leadLFDropped reports whether got is what the caller must get less the LF between the CR
// that ends its last upstream event and the error event of a break.
func leadLFDropped(got []byte, want relayWant) bool {
	alt := withoutLeadLF(want)
	return alt != nil && bytes.Equal(got, alt)
}

// withoutLeadLF is what the caller must get less the LF between the CR that ends its last
// upstream event and the error event of a break; nil when there is no such LF.
func withoutLeadLF(want relayWant) []byte {
	if !want.broke || want.final || want.sawErr || len(want.errEvent) == 0 {
		return nil
	}
	head, ok := bytes.CutSuffix(want.out, want.errEvent)
	if !ok || !bytes.HasSuffix(head, []byte("\r\n")) {
		return nil
	}
	return append(bytes.Clone(head[:len(head)-1]), want.errEvent...)
}

// minScannerRead is metering's least read: a scanner reads at most this past its limit.
const minScannerRead = 4 << 10

// relayWant is what relaying a stream must do, worked out from its bytes read whole.
type relayWant struct {
	out      []byte
	meter    *metering.Meter
	final    bool   // the stream's final event came
	sawErr   bool   // the provider's own error event ended the answer (before any final event)
	broke    bool   // the stream ended (or was cut) with an error before its end
	tooLarge int    // where the event over the limit starts, -1 if none
	cutHeld  bool   // a named run's upstream went on past its final event beyond the limit
	errEvent []byte // the error event that ends a broken stream
}

func (w relayWant) outcome() outcome {
	switch {
	case w.final || w.sawErr || !w.broke:
		if w.meter.Result().UpstreamError {
			return outcomeStreamError
		}
		return outcomeComplete
	default:
		return outcomeStreamError
	}
}

// expectRelay reads in whole, as the README describes the relay, and says what the caller
// must receive and what the call is metered.
func expectRelay(in []byte, f metering.Format, strip bool, end error, limit int, inRun bool) relayWant {
	w := relayWant{meter: metering.NewMeter(f), tooLarge: -1}
	sc := metering.NewScanner(io.MultiReader(bytes.NewReader(in), &errAfter{err: end}), limit)
	var events []metering.Event
	var err error
	for {
		var ev metering.Event
		if ev, err = sc.Next(); err != nil {
			break
		}
		ev.Raw, ev.Data = bytes.Clone(ev.Raw), bytes.Clone(ev.Data)
		events = append(events, ev)
	}
	at := 0
	for _, ev := range events {
		at += len(ev.Raw)
	}
	if errors.Is(err, metering.ErrEventTooLarge) {
		w.tooLarge = at
	}
	w.broke = !errors.Is(err, io.EOF)
	if n := len(events); !w.broke && n > 0 && events[n-1].Unterminated {
		// A clean end inside an event whose JSON is cut is a cut (a close-delimited body).
		last := events[n-1]
		sawData := false
		for _, ev := range events[:n-1] {
			sawData = sawData || ev.Data != nil
		}
		if cutJSON(last.Data) || (last.Data == nil && !sawData && cutJSON(last.Raw)) {
			w.broke, err = true, errStreamCut
		}
	}
	if !w.broke && !slices.ContainsFunc(events, func(ev metering.Event) bool { return !commentsOnly(ev.Raw) }) {
		// A clean end before the upstream sent anything but keep-alive comments: no answer.
		w.broke, err = true, errStreamEmpty
	}
	var held []byte
	sawData, unended := false, false
	for _, ev := range events {
		if ev.Unterminated && w.broke {
			// A half event after a break is not passed on; metered only if it is whole JSON.
			if json.Valid(bytes.TrimSpace(ev.Data)) {
				w.meter.Event(ev)
			}
			break
		}
		if ev.Data == nil && !sawData && wholeJSON(ev.Raw) {
			w.meter.Body(ev.Raw)
		} else {
			w.meter.Event(ev)
		}
		sawData = sawData || ev.Data != nil
		if !w.final && w.meter.UpstreamError() {
			w.sawErr = true
		}
		if strip && metering.IsUsageOnlyChunk(ev.Data) {
			continue
		}
		if !w.final && metering.IsFinalEvent(f, ev) {
			w.final = true
		}
		if inRun && (w.final || w.sawErr) {
			held = append(held, ev.Raw...)
			if len(held) > limit {
				w.cutHeld = true
				w.broke = false
				break
			}
			continue
		}
		w.out = append(w.out, ev.Raw...)
		unended = ev.Unterminated
	}
	if !w.broke && !w.cutHeld && !w.final && !w.sawErr && metering.FinalEventRequired(f) {
		// A clean end before the final event of a format whose providers always send it: cut.
		w.broke, err = true, errStreamUnfinished
	}
	if w.broke && !w.final && !w.sawErr {
		e := &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: "The upstream stream broke before the answer was complete."}
		if isTimeout(err) {
			e = &apiError{Status: http.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout",
				Message: "The upstream did not finish the answer in time."}
		}
		w.errEvent = streamErrorEvent(f, e)
		if unended {
			// The stream ended inside the last event passed on: the error event ends it first.
			w.errEvent = append([]byte("\n\n"), w.errEvent...)
		}
		w.out = append(w.out, w.errEvent...)
	}
	w.out = append(w.out, held...)
	return w
}

// cutReader hands on rest in reads cut where cuts say (0: an empty read), then ends with end.
type cutReader struct {
	rest  []byte
	cuts  []byte
	empty int
	end   error
}

func (r *cutReader) Read(p []byte) (int, error) {
	if len(r.rest) == 0 {
		return 0, r.end
	}
	n := len(r.rest)
	for len(r.cuts) > 0 {
		c := int(r.cuts[0] % 64)
		r.cuts = r.cuts[1:]
		if c == 0 {
			if r.empty++; r.empty > 40 { // more in a row would be a stuck reader
				continue
			}
			return 0, nil
		}
		r.empty = 0
		n = c
		break
	}
	n = copy(p, r.rest[:min(n, len(r.rest))])
	r.rest = r.rest[n:]
	return n, nil
}

// errAfter is a reader that only fails.
type errAfter struct{ err error }

func (e *errAfter) Read([]byte) (int, error) { return 0, e.err }

// countingReader counts what was read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// relayRecorder is a ResponseRecorder whose writes fail once room bytes have gone (room < 0:
// never), as to a caller that left.
type relayRecorder struct {
	*httptest.ResponseRecorder
	room int
}

func (w *relayRecorder) Write(p []byte) (int, error) {
	if w.room < 0 {
		return w.ResponseRecorder.Write(p)
	}
	n := min(len(p), w.room)
	w.room -= n
	w.ResponseRecorder.Write(p[:n])
	if n < len(p) {
		return n, errors.New("write: broken pipe")
	}
	return n, nil
}
