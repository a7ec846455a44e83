package testenv

import (
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestPrivateRedisIsNotAnotherServerOnItsPort: the free port a private server is started on is
// found by listening on it and closing it, so another server may take it first. The server
// then exits at start, but one that answered on the port was taken for it: a test got another
// test's Redis, with that test's settings, not the ones it asked for. A server answering on
// the port is now the private one only if it is the process started.
func TestPrivateRedisIsNotAnotherServerOnItsPort(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: run the tests with `make test`, which installs it")
	}
	other := PrivateRedisURL(t)
	_, port, err := net.SplitHostPort(other[len("redis://") : len(other)-len("/0")])
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	if url, ok, _ := startRedis(t, bin, n, []string{"--maxmemory", "1mb"}); ok {
		t.Fatalf("a server started on %d, a port another server holds, answers as started: %s", n, url)
	}
}

// fatalRecorder is a test whose Fatal ends only the goroutine it is called on, and keeps what
// it said.
type fatalRecorder struct {
	testing.TB
	said string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatal(args ...any) {
	f.said = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.said = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestPrivateRedisThatCannotStartSaysWhy: a redis-server that refuses its arguments exits at
// start on every port tried. The test failed saying only that it did not start on any of
// them, as if the ports were to blame: it now fails with what the server said.
func TestPrivateRedisThatCannotStartSaysWhy(t *testing.T) {
	f := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		PrivateRedisURL(f, "--no-such-directive", "1")
	}()
	<-done
	if !strings.Contains(f.said, "Bad directive") {
		t.Fatalf("the failure does not say why the server exited: %q", f.said)
	}
}
