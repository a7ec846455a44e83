package proxy_test

import (
	"bytes"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestIdemRecordNeverSkipsWhatTheCallerGot: an Idempotency-Key's attempt is pinned before the
// provider's error event goes out (the answer's end for its caller), and again at a final
// event that follows it (the Responses API's response.failed, kept with it when sent back to
// back). An event between the two reached the caller but not the record, whose capture the
// first pin had closed: a replay then skipped it, not the answer the caller had. The record
// must be what the caller got, up to a point: never with a hole in it.
func TestIdemRecordNeverSkipsWhatTheCallerGot(t *testing.T) {
	var calls atomic.Int32
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n")
		fmt.Fprint(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"Hello billing team\"}\n\n")
		fmt.Fprint(w, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"server_error\",\"code\":\"server_error\",\"message\":\"boom\"}}\n\n")
		fmt.Fprint(w, "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n")
		fmt.Fprint(w, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"}}}\n\n")
	}, nil)
	_, key := h.user("standard")
	body := `{"model":"fake-gpt","input":"hi","stream":true}`
	idem := map[string]string{proxy.IdempotencyKeyHeader: "error-then-final"}
	resp := h.post(key, "/v1/responses", body, idem)
	first := readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()
	resp = h.post(key, "/v1/responses", body, idem)
	replay := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.Header.Get(proxy.ReplayedHeader) != "true" || calls.Load() != 1 {
		t.Fatalf("retry: replayed %q, upstream calls %d; want the attempt's answer replayed", resp.Header.Get(proxy.ReplayedHeader), calls.Load())
	}
	if !bytes.Contains(replay, []byte("event: error")) || !bytes.HasPrefix(first, replay) {
		t.Fatalf("the replay is not what the caller got up to the error event:\nfirst:\n%s\nreplay:\n%s", first, replay)
	}
}
