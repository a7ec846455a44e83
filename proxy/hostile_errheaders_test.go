package proxy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// The upstream's answer is refused after its headers were copied (a body that breaks, one over
// max_response_bytes): the caller's 502 must be readable, not carry the upstream's
// Content-Length (or Content-Encoding) for a body it does not have.
func TestHostileBodyErrorAnswerIsReadable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		upstream http.HandlerFunc
		code     string
	}{
		{"content-length lie", func(w http.ResponseWriter, r *http.Request) {
			// Declares 5000 bytes, sends a few, closes.
			conn, bw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			fmt.Fprint(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"id\":\"x\",")
			bw.Flush()
		}, "upstream_broken"},
		{"too large", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "4000")
			fmt.Fprint(w, `{"pad":"`+strings.Repeat("x", 4000-10)+`"}`)
		}, "upstream_response_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, tc.upstream, func(c *config.Config) { c.Limits.MaxResponseBytes = 1024 })
			_, key := h.user("standard")
			// A raw client: it sees exactly what the gateway sends.
			conn, err := net.Dial("tcp", h.gw.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				key, len(chatBody), chatBody)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := readBodyErr(resp)
			t.Logf("status %d Content-Length %q, read %d bytes, err %v: %s", resp.StatusCode, resp.Header.Get("Content-Length"), len(body), err, body)
			if err != nil || resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != tc.code {
				t.Fatalf("the caller could not read its %s error: status %d, err %v, body %q", tc.code, resp.StatusCode, err, body)
			}
		})
	}
}

func readBodyErr(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	var b []byte
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			if err.Error() == "EOF" {
				return b, nil
			}
			return b, err
		}
	}
}

// TestLargeUpstreamErrorIsNotPassedOnCut: an upstream's 4xx answer is passed on as it was
// worded, but only up to 64 KiB is read of it: a larger one reached the caller cut, JSON no
// client could parse. It is replaced by the gateway's own error, with the upstream's status.
func TestLargeUpstreamErrorIsNotPassedOnCut(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":"bad request: %s","type":"invalid_request_error"}}`, strings.Repeat("x", 100<<10))
	}, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !json.Valid(body) {
		t.Fatalf("%d, %d bytes, valid JSON %v: want 400 with an error a client can read", resp.StatusCode, len(body), json.Valid(body))
	}
}

// TestUpstreamErrorCutShortIsNotPassedOn: a 4xx whose body breaks before its Content-Length
// was relayed as the bytes that came, under a Content-Length of their own — a cut JSON the
// caller's SDK could not parse, and no sign that it was cut. Like one too large, it is worded
// by the gateway, with the upstream's status.
func TestUpstreamErrorCutShortIsNotPassedOn(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		fmt.Fprint(bw, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"+
			`{"error":{"message":"bad request`)
		bw.Flush()
	}, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != "upstream_refused" {
		t.Fatalf("%d %s: want 400 upstream_refused, the gateway's words for an answer cut short", resp.StatusCode, body)
	}
}
