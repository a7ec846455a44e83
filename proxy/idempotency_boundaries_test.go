package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// echoGateway is a gateway whose only upstream is echoUpstream, and that upstream's count of calls.
type echoGateway struct {
	*harness
	calls atomic.Int64
}

func newEchoGateway(t *testing.T, mutate func(*config.Config)) *echoGateway {
	e := &echoGateway{}
	e.harness = hostileHarness(t, e.echoUpstream, mutate)
	return e
}

func (e *echoGateway) upstreamCalls() int64 { return e.calls.Load() }

// echoUpstream answers a chat completion whose content is the request's last message, so that
// a test sizes the answer by the request it sends. A message starting with three digits and a
// space is answered with that status (a 2xx, or a 3xx the gateway takes for a failure).
func (e *echoGateway) echoUpstream(w http.ResponseWriter, r *http.Request) {
	e.calls.Add(1)
	var req struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	content := req.Messages[len(req.Messages)-1].Content
	status := http.StatusOK
	if len(content) > 3 && content[3] == ' ' {
		if n, err := strconv.Atoi(content[:3]); err == nil {
			status = n
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
		content)
}

// echoChat is a chat request whose answer, from echoUpstream, echoes content.
func echoChat(content string) string {
	return `{"model":"fake-gpt","messages":[{"role":"user","content":"` + content + `"}]}`
}

// storedAnswerLen is what the record of the key first answered as run holds of its answer, the
// bytes max_replay_len bounds and the caller's share counts: its headers and its body.
func storedAnswerLen(t *testing.T, h *echoGateway, run string) int64 {
	t.Helper()
	ctx := context.Background()
	rec := h.keys.Replay(run)
	resp, err := h.rdb.HExists(ctx, rec, "resp").Result()
	if err != nil || !resp {
		t.Fatalf("record %s keeps no answer (%v)", rec, err)
	}
	hl, err := h.rdb.HStrLen(ctx, rec, "hdrs").Result()
	if err != nil {
		t.Fatal(err)
	}
	rl, err := h.rdb.HStrLen(ctx, rec, "resp").Result()
	if err != nil {
		t.Fatal(err)
	}
	return hl + rl
}

// sizedEcho returns what gives the content of x's whose answer is stored as a given number of
// bytes: the answer of a first call (the caller key's, under Idempotency-Key "probe") is
// measured, and grows a byte with each byte of content (firstAnswer checks it did).
func sizedEcho(t *testing.T, h *echoGateway, key string) func(*testing.T, int64) string {
	t.Helper()
	const probeLen = 100
	probe := sendOK(t, "probe", h.gw.URL, key, echoChat(strings.Repeat("x", probeLen)), map[string]string{proxy.IdempotencyKeyHeader: "probe"})
	h.settled()
	base := storedAnswerLen(t, h, probe.header.Get(proxy.RunIDHeader))
	return func(t *testing.T, size int64) string {
		t.Helper()
		n := probeLen + size - base
		if n <= 0 {
			t.Fatalf("an answer of %d bytes is smaller than the probe's, %d, less its content", size, base)
		}
		return strings.Repeat("x", int(n))
	}
}

// firstAnswer sends content under idemKey and checks it was answered 200 and its stored answer
// holds size bytes (or none, when kept is false); it returns the answer.
func firstAnswer(t *testing.T, h *echoGateway, key, idemKey, content string, size int64, kept bool) answer {
	t.Helper()
	a := sendOK(t, idemKey, h.gw.URL, key, echoChat(content), map[string]string{proxy.IdempotencyKeyHeader: idemKey})
	h.settled()
	run := a.header.Get(proxy.RunIDHeader)
	if kept {
		if got := storedAnswerLen(t, h, run); got != size {
			t.Fatalf("%s: stored answer of %d bytes, want %d (the test's sizing is off)", idemKey, got, size)
		}
	} else if has, err := h.rdb.HExists(context.Background(), h.keys.Replay(run), "resp").Result(); err != nil || has {
		t.Fatalf("%s: answer kept (%t, %v), want it refused", idemKey, has, err)
	}
	return a
}

// expectReplayed checks that a retry of idemKey is first's answer, replayed, and runs nothing.
func expectReplayed(t *testing.T, h *echoGateway, key, idemKey, content string, first answer) {
	t.Helper()
	calls := h.upstreamCalls()
	again := send(h.gw.URL, key, echoChat(content), map[string]string{proxy.IdempotencyKeyHeader: idemKey})
	if again.err != nil || again.status != first.status || again.header.Get(proxy.ReplayedHeader) != "true" || string(again.body) != string(first.body) {
		t.Errorf("retry of %s: %d replayed=%q %v %.200s; want its first answer (%d) replayed",
			idemKey, again.status, again.header.Get(proxy.ReplayedHeader), again.err, again.body, first.status)
	}
	if n := h.upstreamCalls(); n != calls {
		t.Errorf("retry of %s: upstream calls %d -> %d; want none", idemKey, calls, n)
	}
}

// expectNotKept checks that a retry of idemKey is 409 idempotent_response_too_large naming the
// run first ran as, with a message saying why (holding want, not other), and runs nothing.
func expectNotKept(t *testing.T, h *echoGateway, key, idemKey, content string, first answer, want, other string) {
	t.Helper()
	calls := h.upstreamCalls()
	again := send(h.gw.URL, key, echoChat(content), map[string]string{proxy.IdempotencyKeyHeader: idemKey})
	if again.err != nil || again.status != http.StatusConflict {
		t.Fatalf("retry of %s: %d %v %s; want 409", idemKey, again.status, again.err, again.body)
	}
	if code := errorCode(t, again.body); code != "idempotent_response_too_large" {
		t.Errorf("retry of %s: code %s, want idempotent_response_too_large", idemKey, code)
	}
	if run := errorRunID(t, again.body); run != first.header.Get(proxy.RunIDHeader) {
		t.Errorf("retry of %s: 409 names run %s, want %s", idemKey, run, first.header.Get(proxy.RunIDHeader))
	}
	if msg := errorMessage(t, again.body); !strings.Contains(msg, want) || strings.Contains(msg, other) {
		t.Errorf("retry of %s: message %q; want it to say %q, not %q", idemKey, msg, want, other)
	}
	if n := h.upstreamCalls(); n != calls {
		t.Errorf("retry of %s: upstream calls %d -> %d; want none", idemKey, calls, n)
	}
}

// TestIdemAnswerOfExactlyMaxReplayLenIsKept: dedup.max_replay_len is the largest answer kept
// for replays (its headers and body): one of exactly that many bytes is kept and replayed; one
// a byte larger is not, and its retry is told 409 it was larger than max_replay_len — not
// that the caller's share was full.
func TestIdemAnswerOfExactlyMaxReplayLenIsKept(t *testing.T) {
	const maxReplay = 4096
	h := newEchoGateway(t, func(c *config.Config) { c.Dedup.MaxReplayLen = maxReplay })
	_, key := h.user("standard")
	sized := sizedEcho(t, h, key)

	at := sized(t, maxReplay)
	first := firstAnswer(t, h, key, "at-max", at, maxReplay, true)
	expectReplayed(t, h, key, "at-max", at, first)

	over := sized(t, maxReplay+1)
	first = firstAnswer(t, h, key, "past-max", over, 0, false)
	expectNotKept(t, h, key, "past-max", over, first,
		fmt.Sprintf("larger than %d bytes", maxReplay), "already held")
}

// TestIdemAnswersExactlyFillingTheCallersShareAreKept: a caller's kept answers may hold
// dedup.max_replay_bytes_per_caller, each counted as its headers and body plus
// config.ReplayRecordOverhead for its record. Two answers that fill the share to the byte are
// both kept and replayed; a second answer a byte larger (of another caller) is not, and its
// retry is told 409 that the caller's kept answers were full — not that it was too large.
func TestIdemAnswersExactlyFillingTheCallersShareAreKept(t *testing.T) {
	const maxReplay, share = 4096, 8192
	const firstLen = 3000
	const secondLen = share - 2*config.ReplayRecordOverhead - firstLen // within max_replay_len
	h := newEchoGateway(t, func(c *config.Config) {
		c.Dedup.MaxReplayLen = maxReplay
		c.Dedup.MaxReplayBytesPerCaller = share
	})
	_, probeKey := h.user("standard") // the probe's answer counts in its own caller's share
	sized := sizedEcho(t, h, probeKey)

	t.Run("filled to the byte", func(t *testing.T) {
		_, key := h.user("standard")
		a, b := sized(t, firstLen), sized(t, secondLen)
		firstA := firstAnswer(t, h, key, "fill-1", a, firstLen, true)
		firstB := firstAnswer(t, h, key, "fill-2", b, secondLen, true)
		expectReplayed(t, h, key, "fill-1", a, firstA)
		expectReplayed(t, h, key, "fill-2", b, firstB)
	})
	t.Run("a byte past it", func(t *testing.T) {
		_, key := h.user("standard")
		a, b := sized(t, firstLen), sized(t, secondLen+1)
		firstA := firstAnswer(t, h, key, "fill-1", a, firstLen, true)
		firstB := firstAnswer(t, h, key, "fill-2", b, 0, false)
		expectReplayed(t, h, key, "fill-1", a, firstA)
		expectNotKept(t, h, key, "fill-2", b, firstB,
			fmt.Sprintf("already held %d bytes", share), "larger than")
	})
}

// TestIdemUpstream299PinsAnd300DoesNot: every 2xx is a success (DESIGN §6: an attempt pins its
// key on a 2xx answer), 299 the last of them: relayed as it came, kept and replayed with its
// status. 300 is the upstream's failure: answered 502, the key left free, and its retry runs.
func TestIdemUpstream299PinsAnd300DoesNot(t *testing.T) {
	h := newEchoGateway(t, nil)
	_, key := h.user("standard")

	const ok = "299 the top of 2xx"
	first := send(h.gw.URL, key, echoChat(ok), map[string]string{proxy.IdempotencyKeyHeader: "status-299"})
	if first.err != nil || first.status != 299 || !strings.Contains(string(first.body), ok) {
		t.Fatalf("299 upstream: %d %v %s; want its answer relayed as 299", first.status, first.err, first.body)
	}
	h.settled()
	expectReplayed(t, h, key, "status-299", ok, first)

	const failed = "300 past 2xx"
	calls := h.upstreamCalls()
	for i := range 2 {
		a := send(h.gw.URL, key, echoChat(failed), map[string]string{proxy.IdempotencyKeyHeader: "status-300"})
		if a.err != nil || a.status != http.StatusBadGateway || errorCode(t, a.body) != "upstream_error" {
			t.Fatalf("300 upstream, call %d: %d %v %s; want 502 upstream_error", i, a.status, a.err, a.body)
		}
		if a.header.Get(proxy.ReplayedHeader) != "" {
			t.Errorf("300 upstream, call %d: replayed; want it run", i)
		}
		h.settled()
	}
	if n := h.upstreamCalls() - calls; n != 2 {
		t.Errorf("300 upstream: %d upstream calls for the key and its retry, want 2 (the key left free)", n)
	}
}
