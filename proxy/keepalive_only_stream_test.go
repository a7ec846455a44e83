package proxy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/proxy"
)

// TestKeepAliveOnlyStreamIsBroken: a stream whose upstream sent only keep-alive comments
// (": OPENROUTER PROCESSING", a router's wait for its provider) and then closed has no answer,
// as a stream that ends before its first event has none: the caller is told the stream broke
// (upstream_broken), the call ends stream_error, and its Idempotency-Key is not pinned to the
// empty answer — a retry with the key runs again rather than replaying nothing for a day.
func TestKeepAliveOnlyStreamIsBroken(t *testing.T) {
	var calls atomic.Int32
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		if n > 1 {
			fmt.Fprint(w, hostileChunk+hostileUsage+"data: [DONE]\n\n")
			return
		}
		for i := 0; i < 3; i++ {
			fmt.Fprint(w, ": OPENROUTER PROCESSING\n\n")
		}
	}, nil)
	u, key := h.user("standard")
	idem := map[string]string{"Idempotency-Key": "k-keepalive"}
	resp := h.post(key, "/v1/chat/completions", streamBody, idem)
	got := readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if lastEventErrorCode(t, got) != "upstream_broken" {
		t.Errorf("the caller got %q: a clean end of a stream with no answer, want an upstream_broken error event", got)
	}
	if run.SettleSource.String != string(holds.SourceStreamError) {
		t.Errorf("settled %q, want %q", run.SettleSource.String, holds.SourceStreamError)
	}
	resp = h.post(key, "/v1/chat/completions", streamBody, idem)
	again := readAll(t, resp.Body)
	resp.Body.Close()
	if !bytes.Contains(again, []byte("Hello billing team")) {
		t.Errorf("the retry with the same key got %q, want the answer of a new attempt", again)
	}
}

// TestKeepAliveOnlyStreamEndingInAHalfCommentIsBroken: the same stream, its last comment cut
// before its line ending. The half comment was relayed as any event the stream ended in, and
// the gateway's upstream_broken event written right after it, on the same line: the caller's
// SSE parser read one comment, no event, and a clean end of an empty answer. The half comment
// is dropped, as a half event after a break is, and the error event is one the caller reads.
func TestKeepAliveOnlyStreamEndingInAHalfCommentIsBroken(t *testing.T) {
	expectStreamBroken(t, ": OPENROUTER PROCESSING\n\n: OPENROUTER PROCESSING")
}

// expectStreamBroken checks that a stream whose upstream sent stream (and closed) is told the
// caller as one that broke, its last event an upstream_broken error, and settles stream_error.
func expectStreamBroken(t *testing.T, stream string) {
	t.Helper()
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, stream)
	}, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	got := readAll(t, resp.Body)
	resp.Body.Close()
	if code := lastEventErrorCode(t, got); code != "upstream_broken" {
		t.Errorf("the caller got %q: its last event's error code is %q, want upstream_broken", got, code)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if run.SettleSource.String != string(holds.SourceStreamError) {
		t.Errorf("settled %q, want %q", run.SettleSource.String, holds.SourceStreamError)
	}
}

// lastEventErrorCode is the error code of the last event of stream that carries data, read as
// an SSE client reads it (a line the stream ends without is no event), or "" when it has none.
func lastEventErrorCode(t *testing.T, stream []byte) string {
	t.Helper()
	sc := metering.NewScanner(bytes.NewReader(stream), 1<<20)
	code := ""
	for {
		ev, err := sc.Next()
		if errors.Is(err, io.EOF) {
			return code
		}
		if err != nil {
			t.Fatalf("reading the caller's stream: %v", err)
		}
		if ev.Data != nil && !ev.Unterminated {
			code = gjson.GetBytes(ev.Data, "error.code").String()
		}
	}
}

// TestKeepAliveOnlyStreamAfterAByteOrderMarkIsBroken: the same stream of keep-alive comments,
// opened by a byte order mark (which an SSE parser skips): still no answer. Read as more than
// comments, it ended as a complete empty answer, and its Idempotency-Key was pinned to nothing.
func TestKeepAliveOnlyStreamAfterAByteOrderMarkIsBroken(t *testing.T) {
	expectStreamBroken(t, "\xEF\xBB\xBF: OPENROUTER PROCESSING\n\n: OPENROUTER PROCESSING\n\n")
}
