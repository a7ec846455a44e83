package main

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestPprofServerLogsAsJSON: net/http's own lines of the profiler's listener (a handler's
// panic, an accept error) went to stderr as plain text — its http.Server had no ErrorLog, as
// the public listener's has — and a log pipeline reading JSON lines dropped or misread them.
// They are zap lines now. A panicking handler, swapped in, makes net/http write one.
func TestPprofServerLogsAsJSON(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	ps := newPprofServer(zap.New(core))
	ps.Handler = http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("profiler handler failed") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ps.Serve(ln) }()
	t.Cleanup(func() { _ = ps.Close() })
	// net/http logs the panic before it closes the connection, so the request's error (the
	// connection closed unanswered) comes after the line.
	if resp, err := http.Get("http://" + ln.Addr().String() + "/debug/pprof/"); err == nil {
		resp.Body.Close()
		t.Fatalf("panicking handler answered %d", resp.StatusCode)
	}
	for _, l := range logs.All() {
		if strings.Contains(l.Message, "panic serving") && strings.Contains(l.Message, "profiler handler failed") {
			return
		}
	}
	t.Fatalf("no zap line for the profiler's panic: %v", logs.All())
}
