package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/config"
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
		errorThenFinal(w, "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n")
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

// errorThenFinal answers as a Responses stream whose provider sends output, then its error
// event, then between (any events), then its final event (response.failed).
func errorThenFinal(w http.ResponseWriter, between string) {
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n")
	fmt.Fprint(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"Hello billing team\"}\n\n")
	fmt.Fprint(w, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"server_error\",\"code\":\"server_error\",\"message\":\"boom\"}}\n\n")
	fmt.Fprint(w, between)
	fmt.Fprint(w, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"}}}\n\n")
}

// TestIdemErrorThenFinalCountedOnceAgainstTheShare: an answer pinned at the provider's error
// event and again at the final event right after it (the Responses API's error, then
// response.failed) is one answer kept in Redis, but both pins counted their whole size
// against the caller's share of kept answers (dedup.max_replay_bytes_per_caller): it took
// about twice its room, and the caller's later answers were refused keeping that much sooner.
// The count must be the record's size, once.
func TestIdemErrorThenFinalCountedOnceAgainstTheShare(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) { errorThenFinal(w, "") }, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/responses", `{"model":"fake-gpt","input":"hi","stream":true}`,
		map[string]string{proxy.IdempotencyKeyHeader: "error-then-final-share"})
	first := readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()

	ctx := context.Background()
	rec, err := h.rdb.HGetAll(ctx, h.keys.Replay(resp.Header.Get(proxy.RunIDHeader))).Result()
	if err != nil || rec["resp"] == "" || !strings.Contains(string(first), "response.failed") || !strings.Contains(rec["resp"], "response.failed") {
		t.Fatalf("the answer was not kept to its final event (%v):\nsent:\n%s\nkept:\n%s", err, first, rec["resp"])
	}
	buckets, err := h.rdb.HGetAll(ctx, h.keys.ReplayBytes(u.ID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	var counted int64
	for _, n := range buckets {
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("bucket %q: %v", n, err)
		}
		counted += v
	}
	if want := int64(len(rec["hdrs"])+len(rec["resp"])) + config.ReplayRecordOverhead; counted != want {
		t.Fatalf("the caller's kept answers are counted %d bytes; its one kept answer is %d", counted, want)
	}
}

// TestIdemErrorThenFinalPastMaxReplayLenKeepsNothing: an answer pinned at the provider's error
// event fits dedup.max_replay_len, and with the final event after it (the Responses API's
// response.failed), stored again, does not. The second store marked it too large but left the
// first's answer in the record: every retry was told 409 "not kept for replay" while Redis
// kept it for replay_ttl, counted against the caller's share. An answer not kept must not be
// in the record.
func TestIdemErrorThenFinalPastMaxReplayLenKeepsNothing(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) { errorThenFinal(w, "") }, func(c *config.Config) { c.Dedup.MaxReplayLen = 450 }) // the answer to its error event fits, with response.failed not
	_, key := h.user("standard")
	body := `{"model":"fake-gpt","input":"hi","stream":true}`
	idem := map[string]string{proxy.IdempotencyKeyHeader: "error-then-final-large"}
	resp := h.post(key, "/v1/responses", body, idem)
	first := readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()
	if !strings.Contains(string(first), "response.failed") {
		t.Fatalf("the caller did not get the final event:\n%s", first)
	}
	rec, err := h.rdb.HGetAll(context.Background(), h.keys.Replay(resp.Header.Get(proxy.RunIDHeader))).Result()
	if err != nil || rec["large"] != "1" {
		t.Fatalf("record %v (%v): want the answer marked too large", rec, err)
	}
	if _, kept := rec["resp"]; kept {
		t.Errorf("the record keeps %d bytes of an answer it says was not kept", len(rec["resp"]))
	}
	again := h.post(key, "/v1/responses", body, idem)
	replay := readAll(t, again.Body)
	again.Body.Close()
	if again.StatusCode != http.StatusConflict || !strings.Contains(string(replay), "idempotent_response_too_large") {
		t.Errorf("retry: %d %s; want 409 idempotent_response_too_large", again.StatusCode, replay)
	}
}
