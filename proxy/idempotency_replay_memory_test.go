package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemReplaysCountInTheCallersMemory: replays are answered before admission, so
// max_in_flight does not bound them, and each holds its stored answer (up to max_replay_len)
// until its caller has it. A caller that sends its key again on connections it does not read
// made the gateway hold a copy per connection, without bound. The answer a replay sends counts
// in the caller's share of request memory while it is sent: past it, 429
// too_many_request_bytes (retried by the SDKs); once the replay that held it has ended, the
// key is replayed again.
func TestIdemReplaysCountInTheCallersMemory(t *testing.T) {
	h, key, answer := bigAnswerPinned(t, 20<<20)
	idem := map[string]string{proxy.IdempotencyKeyHeader: "big-answer"}

	// A replay whose caller reads its status line and nothing more, with a small window.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.DialContext(context.Background(), "tcp", strings.TrimPrefix(h.gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"%s: big-answer\r\nContent-Length: %d\r\n\r\n%s", key, proxy.IdempotencyKeyHeader, len(chatBody), chatBody)
	status, err := bufio.NewReaderSize(conn, 512).ReadString('\n')
	if err != nil || !strings.HasPrefix(status, "HTTP/1.1 200") {
		t.Fatalf("held replay: %q %v", status, err)
	}

	again := send(h.gw.URL, key, chatBody, idem)
	if again.status != http.StatusTooManyRequests || errorCode(t, again.body) != "too_many_request_bytes" || again.header.Get("Retry-After") == "" {
		t.Fatalf("replay while another holds the caller's memory: %d %v %.200s, want 429 too_many_request_bytes", again.status, again.header, again.body)
	}
	conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := send(h.gw.URL, key, chatBody, idem)
		if a.status == http.StatusOK && a.header.Get(proxy.ReplayedHeader) == "true" && len(a.body) == len(answer) {
			break
		}
		if a.status != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("replay once the held one ended: %d %.200s", a.status, a.body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
}

// TestIdemReplayLargerThanTheCallersShare: an answer larger than the caller's share of request
// memory (max_replay_len may be set above it) is still replayed to a caller with nothing else
// in flight: it counts the whole share, not more.
func TestIdemReplayLargerThanTheCallersShare(t *testing.T) {
	h, key, answer := bigAnswerPinned(t, 8<<20)
	a := send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: "big-answer"})
	if a.status != http.StatusOK || a.header.Get(proxy.ReplayedHeader) != "true" || len(a.body) != len(answer) {
		t.Fatalf("replay of an answer larger than the caller's share: %d %v %.200s", a.status, a.header, a.body)
	}
}

// bigAnswerPinned pins the Idempotency-Key "big-answer" of a fresh user (its key returned) on a
// 12 MiB answer (returned), past the gateway's send buffer (at most tcp_wmem's 4 MiB by
// default) and a small window, with perCaller bytes of request memory for each caller.
func bigAnswerPinned(t *testing.T, perCaller int64) (*harness, string, string) {
	t.Helper()
	const answerBytes = 12 << 20
	dir := t.TempDir()
	content := strings.Repeat("word ", answerBytes/5)
	answer := `{"id":"chatcmpl-big","object":"chat.completion","created":1,"model":"fake-gpt","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"` + content + `"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":12,"completion_tokens":20,"total_tokens":32}}`
	if err := os.WriteFile(filepath.Join(dir, "big.json"), []byte(answer), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarnessWithFixtures(t, dir, func(c *config.Config) {
		c.Dedup.MaxReplayLen = 16 << 20
		c.Limits.MaxBodyMemoryPerCaller = perCaller
	})
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "big-answer"}
	sendOK(t, "first", h.gw.URL, key, chatBody, with(idem, fakellm.HeaderReplay, "big.json"))
	h.settled()
	return h, key, answer
}
