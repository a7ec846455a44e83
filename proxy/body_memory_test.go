package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// TestRequestBodiesInMemoryAreBounded: the request bodies a process holds, read and kept
// while their calls run, are bounded in all (limits.max_body_memory) and per caller
// (max_body_memory_per_caller). Unbounded, a caller with any valid key could open
// connections sending bodies until the host's memory ran out, and the process killed by it
// would leave every call in flight to the reconciler. A body that does not fit is refused at
// once — 503 server_busy when the process is full, 429 too_many_request_bytes when the
// caller's own share is — with nothing held, and fits again once the bodies before it are
// gone. A caller holds bodies by sending part of one and waiting, as a slow link does.
func TestRequestBodiesInMemoryAreBounded(t *testing.T) {
	const (
		bodySize = 60 << 10
		heldPart = 50 << 10
	)
	body := `{"model":"fake-gpt","messages":[{"role":"user","content":"` +
		strings.Repeat("x", bodySize-60) + `"}]}`
	for _, tc := range []struct {
		name              string
		all, perCaller    int64
		sameCaller        bool // the second body is the holding caller's own
		wantStatus        int
		wantCode          string
		wantRetryAfterSec int
	}{
		{name: "process full", all: 100 << 10, perCaller: 100 << 10, wantStatus: http.StatusServiceUnavailable, wantCode: "server_busy", wantRetryAfterSec: 1},
		{name: "caller's share full", all: 200 << 10, perCaller: 100 << 10, sameCaller: true, wantStatus: http.StatusTooManyRequests, wantCode: "too_many_request_bytes", wantRetryAfterSec: 1},
		{name: "another caller fits beside a full share", all: 200 << 10, perCaller: 100 << 10, wantStatus: http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) {
				c.Limits.MaxBodyBytes = 64 << 10
				c.Limits.MaxBodyMemory, c.Limits.MaxBodyMemoryPerCaller = tc.all, tc.perCaller
				c.Limits.ClientWriteTimeout = time.Minute // the held body waits while the test works
				plan := c.Plans["standard"]
				plan.HoldNormalCredits, plan.HoldHeavyCredits = config.CreditsOf(500), config.CreditsOf(500) // a 60 KiB prompt fits its hold
				c.Plans["standard"] = plan
			})
			holder, holderKey := h.user("standard")
			other, otherKey := h.user("standard")
			second, secondKey := other, otherKey
			if tc.sameCaller {
				second, secondKey = holder, holderKey
			}

			held := startHeldBody(t, h, holderKey, body, heldPart)
			h.waitRequestBodyBytes(func(n int64) bool { return n >= heldPart }, "the held body's first 50 KiB")

			resp := h.post(secondKey, "/v1/chat/completions", body, nil)
			answer := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("second body: %d %s, want %d", resp.StatusCode, answer, tc.wantStatus)
			}
			if tc.wantCode != "" {
				if code := errorCode(t, answer); code != tc.wantCode {
					t.Fatalf("second body refused %s, want %s", code, tc.wantCode)
				}
				if ra := resp.Header.Get("Retry-After"); ra != strconv.Itoa(tc.wantRetryAfterSec) {
					t.Fatalf("Retry-After %q, want %d", ra, tc.wantRetryAfterSec)
				}
				// Refused before admission: no hold of the refused request (the held one is not
				// read whole yet, so none of it either), none left live.
				if n := h.runsOf(second.ID); n != 0 {
					t.Fatalf("%d runs of the refused caller", n)
				}
				if _, live := h.holdCount(); live != 0 {
					t.Fatalf("%d holds live after the refusal", live)
				}
				// A body over max_body_bytes is refused for its size, not told to retry (429 or
				// 503), however full the memory is.
				resp = h.post(secondKey, "/v1/chat/completions", padded("fake-gpt", 200<<10), nil)
				answer = readAll(t, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusRequestEntityTooLarge || errorCode(t, answer) != "request_too_large" {
					t.Fatalf("oversized body: %d %s, want 413 request_too_large", resp.StatusCode, answer)
				}
				// A caller that waits for 100 Continue before sending is refused before it
				// sends: its Content-Length is counted before anything is read.
				if status := expectContinue(t, h, secondKey, len(body)); status != tc.wantStatus {
					t.Fatalf("Expect: 100-continue: first answer %d, want %d with no 100 Continue before it", status, tc.wantStatus)
				}
				// A token count's body is read the same way, and counted the same.
				count := `{"model":"claude-test","messages":[{"role":"user","content":"` + strings.Repeat("x", bodySize-60) + `"}]}`
				resp := h.post("", "/v1/messages/count_tokens", count, map[string]string{"X-Api-Key": secondKey})
				answer := readAll(t, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.wantStatus || errorCode(t, answer) != tc.wantCode {
					t.Fatalf("token count's body: %d %s, want %d %s", resp.StatusCode, answer, tc.wantStatus, tc.wantCode)
				}
			}

			if status := held.finish(t); status != http.StatusOK {
				t.Fatalf("held body: %d once sent whole, want 200", status)
			}
			h.waitRequestBodyBytes(func(n int64) bool { return n == 0 }, "every body given back after its call")
			h.postOK(t, secondKey, "/v1/chat/completions", body, nil) // second body sent again after the first call ended
			h.waitRequestBodyBytes(func(n int64) bool { return n == 0 }, "every body given back at the end")
		})
	}
}

// holdBodies starts one held body of size bytes per key, each sent but for its last bytes,
// waits until the gateway has read them, and returns what ends them: their connections
// closed, and every body given back.
func holdBodies(t *testing.T, h *harness, keys []string, size int) (release func()) {
	t.Helper()
	body := padded("fake-gpt", size)
	sent := len(body) - 10
	var held []*heldBody
	for _, k := range keys {
		held = append(held, startHeldBody(t, h, k, body, sent))
	}
	want := int64(len(keys) * sent)
	h.waitRequestBodyBytes(func(n int64) bool { return n >= want }, "the held bodies read")
	return func() {
		for _, b := range held {
			b.conn.Close()
		}
		h.waitRequestBodyBytes(func(n int64) bool { return n == 0 }, "the held bodies given back")
	}
}

// padded is a request body for model of about size bytes.
func padded(model string, size int) string {
	return `{"model":"` + model + `","pad":"` + strings.Repeat("x", max(size-40, 0)) + `"}`
}

// expectContinue sends a request's headers with Expect: 100-continue and a Content-Length of
// size, and returns the status of the first answer the gateway gives before any body byte.
func expectContinue(t *testing.T, h *harness, key string, size int) int {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", key, size); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("Expect: 100-continue: %v", err)
	}
	code, err := strconv.Atoi(strings.Fields(status)[1])
	if err != nil {
		t.Fatalf("status line %q: %v", status, err)
	}
	return code
}

// heldBody is a request whose body the caller has sent part of, and holds the rest back.
type heldBody struct {
	conn net.Conn
	rest string
}

func startHeldBody(t *testing.T, h *harness, key, body string, sent int) *heldBody {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body[:sent]); err != nil {
		t.Fatal(err)
	}
	return &heldBody{conn: conn, rest: body[sent:]}
}

// finish sends the rest of the body and returns the answer's status.
func (b *heldBody) finish(t *testing.T) int {
	t.Helper()
	if _, err := io.WriteString(b.conn, b.rest); err != nil {
		t.Fatal(err)
	}
	_ = b.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(b.conn), nil)
	if err != nil {
		t.Fatalf("held body's answer: %v", err)
	}
	defer resp.Body.Close()
	readAll(t, resp.Body)
	return resp.StatusCode
}

// waitRequestBodyBytes waits, up to 10 s, for tollgate_request_body_bytes to satisfy ok.
func (h *harness) waitRequestBodyBytes(ok func(int64) bool, what string) {
	h.t.Helper()
	waitGauge(h, "tollgate_request_body_bytes", ok, what)
}

// gauge reads one metric without labels from /metrics.
func (h *harness) gauge(name string) int64 {
	h.t.Helper()
	v := h.metric(name)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		h.t.Fatalf("%s %q in /metrics: %v", name, v, err)
	}
	return int64(f)
}

// runsOf counts the runs a user has, settled or not.
func (h *harness) runsOf(userID uint64) int {
	h.t.Helper()
	var n int
	if err := h.db.Get(&n, "SELECT COUNT(*) FROM run_holds WHERE user_id = ?", userID); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// waitGauge waits until the metric name (a gauge or counter without labels) satisfies ok.
func waitGauge(h *harness, name string, ok func(int64) bool, what string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		n := h.gauge(name)
		if ok(n) {
			return
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("%s %d after 10 s: waited for %s", name, n, what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
