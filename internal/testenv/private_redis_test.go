package testenv

import (
	"net"
	"os/exec"
	"strconv"
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
	if url, ok := startRedis(t, bin, n, []string{"--maxmemory", "1mb"}); ok {
		t.Fatalf("a server started on %d, a port another server holds, answers as started: %s", n, url)
	}
}
