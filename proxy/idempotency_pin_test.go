package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemPinnedBeforeAnswerEnds: an Idempotency-Key attempt's record must pin its answer
// before the answer's end reaches the caller. Pinned after it, a process killed in between
// leaves a caller holding a complete answer (which the reconciler charges from the tally)
// and a key that is not pinned: the SDK's retry of that request runs again and is charged
// again.
//
// The probe: the moment the gateway writes the pinning record to Redis, the test looks, without
// reading, at what has reached the caller's socket (the caller reads nothing before that).
// The answer's end must not be there yet. Then the caller reads its answer and a retry must
// replay it byte for byte.
func TestIdemPinnedBeforeAnswerEnds(t *testing.T) {
	cases := []struct {
		name, path, body string
		hdr              string
		end              string // what only the answer's end carries
	}{
		{"chat", "/v1/chat/completions", chatBody, "", ""}, // the whole JSON body
		{"chat stream", "/v1/chat/completions", streamBody, "", "data: [DONE]"},
		{"messages stream", "/v1/messages",
			`{"model":"claude-test","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "", "message_stop"},
		// A stream that broke after output pins its key too; its end is the gateway's error event.
		{"broken stream", "/v1/chat/completions", streamBody,
			fakellm.HeaderChunks + ": 20\r\n" + fakellm.HeaderDropAfter + ": 5\r\n", "upstream_broken"},
		// So does one the provider ended with its own error event after output (the SDKs raise
		// on it: it is the answer's end, as a final event is).
		{"provider's error event", "/v1/chat/completions", streamBody,
			fakellm.HeaderChunks + ": 20\r\n" + fakellm.HeaderErrorAfter + ": 5\r\n", "fake upstream error"},
		// Responses: the error event, then response.failed; the record keeps both, as sent.
		{"responses error event", "/v1/responses", `{"model":"fake-gpt","stream":true,"input":"hi"}`,
			fakellm.HeaderChunks + ": 20\r\n" + fakellm.HeaderErrorAfter + ": 5\r\n", "fake upstream error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			_, key := h.user("standard")
			probe := newPinProbe(h, false)
			conn := probe.sendUntilPinned(t, h, tc.path, key, "pin-"+strings.ReplaceAll(tc.name, " ", "-"), tc.hdr, tc.body)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			first, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("first: %d %v %s", resp.StatusCode, err, first)
			}
			end := []byte(tc.end)
			if tc.end == "" {
				end = first
			}
			if !bytes.Contains(first, end) {
				t.Fatalf("the answer lacks its end %q: %s", end, first)
			}
			if seen := probe.seenAtPin(); bytes.Contains(seen, end) {
				t.Fatalf("the caller had the end of its answer before the record pinned it: a kill in between makes its retry run again\nat pin:\n%s", seen)
			}

			h.settled()
			retry := h.post(key, tc.path, tc.body, map[string]string{proxy.IdempotencyKeyHeader: "pin-" + strings.ReplaceAll(tc.name, " ", "-")})
			replayed := readAll(t, retry.Body)
			if retry.Header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(replayed, first) {
				t.Fatalf("retry: %d replayed=%q\n%s\nwant the first answer byte for byte:\n%s",
					retry.StatusCode, retry.Header.Get(proxy.ReplayedHeader), replayed, first)
			}
		})
	}
}

// TestIdemPinnedAnswerWhoseEndWasLostStaysPinned: a caller that leaves as its pinned answer's
// last bytes go out has a key pinned on an answer the provider completed. The attempt must be
// settled as complete: if Redis then loses the record, the retry is told the answer was lost
// (the attempt's settled row says complete), not run and charged again as after a cancel.
func TestIdemPinnedAnswerWhoseEndWasLostStaysPinned(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const idemKey = "pin-then-leave"
	newPinProbe(h, true).sendUntilPinned(t, h, "/v1/chat/completions", key, idemKey, "", streamBody)
	h.settled()
	runID := proxy.IdempotentRunID(u.ID, idemKey, 0)
	if run := h.run(u.ID, runID); run.SettleSource.String != "complete" {
		t.Fatalf("attempt settled as %q; its answer was whole and pinned: want complete", run.SettleSource.String)
	}

	// Redis loses the record: the retry must not run again.
	ctx := context.Background()
	recs, _ := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err := h.rdb.Del(ctx, recs...).Err(); err != nil {
		t.Fatal(err)
	}
	calls := h.fake.Calls()
	resp := h.post(key, "/v1/chat/completions", streamBody, map[string]string{proxy.IdempotencyKeyHeader: idemKey})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()
	if n := h.fake.Calls(); n != calls || resp.StatusCode == http.StatusOK {
		t.Fatalf("retry after Redis lost the record of a pinned attempt: %d %s, upstream calls %d -> %d; want 409 idempotent_response_lost",
			resp.StatusCode, body, calls, n)
	}
	// Nor charged again: the pinned attempt is the user's one charge (the upstream's count alone
	// let a retry charged its hold without being forwarded pass).
	h.expectCharges(u.ID, []string{runID})
}

// pinProbe is a go-redis hook that, when a command writes the "run" field of an idempotency
// record (the pin), peeks at the caller's socket without consuming it.
type pinProbe struct {
	recordPrefix string
	fired        chan struct{}
	// reset: after peeking, the caller hangs up (RST) before the answer's end is written.
	reset bool

	mu   sync.Mutex
	conn *net.TCPConn
	seen []byte
	once sync.Once
}

// newPinProbe hooks a probe into h's Redis client; reset: see pinProbe.
func newPinProbe(h *harness, reset bool) *pinProbe {
	p := &pinProbe{recordPrefix: h.keys.Prefix + "replay:", fired: make(chan struct{}), reset: reset}
	h.rdb.AddHook(p)
	return p
}

// sendUntilPinned sends one Idempotency-Key request on a connection of its own (extra: more
// header lines, each ending in CRLF) and returns once the gateway has pinned the answer, with
// nothing read from the connection.
func (p *pinProbe) sendUntilPinned(t *testing.T, h *harness, path, key, idemKey, extra, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", h.gw.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.mu.Lock()
	p.conn = conn.(*net.TCPConn)
	p.mu.Unlock()
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"%s%s: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		path, key, extra, proxy.IdempotencyKeyHeader, idemKey, len(body), body)
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.fired:
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt's answer was never pinned in its idempotency record")
	}
	return conn
}

func (p *pinProbe) seenAtPin() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen
}

func (p *pinProbe) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *pinProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		p.check(cmd)
		return next(ctx, cmd)
	}
}

func (p *pinProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			p.check(c)
		}
		return next(ctx, cmds)
	}
}

// check fires the probe, once, on a command that pins an idempotency record.
func (p *pinProbe) check(c redis.Cmder) {
	if pinsRecord(c.Args(), p.recordPrefix) {
		p.once.Do(func() {
			p.peek()
			if p.reset {
				p.hangUp()
			}
			close(p.fired)
		})
	}
}

// pinsRecord: a write of an idempotency record that sets its "run" field — an HSET, or the
// gateway's guarded record write (a script: KEYS record; ARGV run id, attempt, body hash, ttl,
// then field/value pairs).
func pinsRecord(args []any, prefix string) bool {
	first := 2 // an HSET's first field
	switch {
	case len(args) >= 4 && strings.EqualFold(fmt.Sprint(args[0]), "hset"):
	case len(args) >= 11 && (strings.EqualFold(fmt.Sprint(args[0]), "evalsha") || strings.EqualFold(fmt.Sprint(args[0]), "eval")):
		args, first = args[2:], 7 // numkeys, key, run id, attempt, body hash, ttl, fields deleted
	default:
		return false
	}
	if !strings.HasPrefix(fmt.Sprint(args[1]), prefix) {
		return false
	}
	for i := first; i < len(args); i += 2 {
		if fmt.Sprint(args[i]) == "run" {
			return true
		}
	}
	return false
}

// hangUp closes the caller's connection with a reset, so that the gateway's next write to it fails.
func (p *pinProbe) hangUp() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.conn.SetLinger(0)
	_ = p.conn.Close()
}

// peek reads what waits in the caller's socket, leaving it there.
func (p *pinProbe) peek() {
	p.mu.Lock()
	defer p.mu.Unlock()
	raw, err := p.conn.SyscallConn()
	if err != nil {
		panic(err)
	}
	buf := make([]byte, 1<<20)
	n := 0
	var peekErr error
	if err := raw.Control(func(fd uintptr) {
		n, _, peekErr = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil {
		panic(err)
	}
	if peekErr != nil && peekErr != syscall.EAGAIN {
		panic(peekErr)
	}
	p.seen = buf[:max(n, 0)]
}
