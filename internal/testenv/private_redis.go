package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// PrivateRedisURL starts a Redis server of this test's own — for a setting no test sharing
// the common one may see (a memory policy, a limit, an ACL) — and returns its redis:// URL. It
// listens on loopback only, keeps nothing on disk, and is killed at cleanup. It needs the
// redis-server that `make test` installs, and fails the test without it.
func PrivateRedisURL(t testing.TB, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: run the tests with `make test`, which installs it")
	}
	// The free port is found by listening on it and closing it, so another process may take
	// it before the server does: the server then exits at start, and another port is tried.
	const attempts = 5
	var said string
	for range attempts {
		port, err := freeLoopbackPort()
		if err != nil {
			t.Fatal(err)
		}
		url, ok, out := startRedis(t, bin, port, args)
		if ok {
			return url
		}
		said = out
	}
	// What it said last is why: a port taken, or arguments it refuses (then on every port).
	t.Fatalf("redis-server %v did not start on any of %d ports; it said: %s", args, attempts, said)
	return ""
}

// startRedis runs one redis-server on port and waits up to 10 s for it to answer; ok is false
// when it exited at start, and said is then what it wrote (its last 4 KiB).
//
// It is asked on a Unix socket of its own, not on port: another server that took the port
// first answers there, while this one exits at start (Redis exits when it cannot listen on its
// port, before it serves any socket). Asked on the port, that other server was taken for it.
func startRedis(t testing.TB, bin string, port int, args []string) (url string, ok bool, said string) {
	t.Helper()
	// Not under t.TempDir(): a socket's path is limited to 107 bytes, which a long test name
	// passes.
	sockDir, err := os.MkdirTemp("", "tgredis")
	if err != nil {
		t.Fatalf("socket directory of redis-server: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "redis.sock")
	cmd := DiesWithTests(exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--unixsocket", sock, "--unixsocketperm", "700",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)...))
	// Read only once it has exited (Wait has copied all of it): why it did not start.
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		// Any reply, an authentication error included, means it listens: an ACL under test
		// may refuse the default user.
		rdb := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, MaxRetries: -1, DisableIdentity: true})
		err := rdb.Ping(ctx).Err()
		rdb.Close()
		if err == nil || isRedisReply(err) {
			return "redis://" + addr + "/0", true, ""
		}
		select {
		case <-exited:
			said := out.Bytes()
			return "", false, string(said[max(0, len(said)-4096):])
		case <-ctx.Done():
			t.Fatalf("redis-server did not answer on %s within 10 s: %v", addr, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// isRedisReply says whether err is an error reply of a server, not a transport failure.
func isRedisReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

func freeLoopbackPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
