package testenv

import (
	"context"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Slow is a network between a client and its server on which every reply comes, but late: the
// first read after each write waits a delay drawn anew in [Min, Max] before the reply is
// passed on, as from a server that answers every command slowly (a swapping host, a slow
// fsync, a busy single thread) rather than one that has hung (StallingConn) or gone away
// (Lossy). The server runs each write as soon as it arrives; only the reply is late. A read
// whose deadline comes first ends at it with a timeout, as the client's own would, and the
// reply is then read late by whoever reads the connection next (the client closes it).
//
// While Off is set replies pass at once: a test warms up, and comes back to rest, at full
// speed.
type Slow struct {
	Min, Max time.Duration
	Off      atomic.Bool
	// Delayed counts the replies delayed: a test whose traffic never met the delay would
	// otherwise pass without testing anything.
	Delayed atomic.Int64
}

// delay is the wait before the next reply.
func (s *Slow) delay() time.Duration {
	if s.Max <= s.Min {
		return s.Min
	}
	return s.Min + rand.N(s.Max-s.Min+1)
}

// Dial connects through the slow network; it is a redis.Options.Dialer.
func (s *Slow) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &slowConn{Conn: c, s: s}, nil
}

// SlowMySQLDSN is MySQLDSN on connections through s.
func SlowMySQLDSN(t testing.TB, s *Slow) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tg-slow-" + RandomID(6)
	mysql.RegisterDialContext(cfg.Net, func(ctx context.Context, addr string) (net.Conn, error) { return s.Dial(ctx, "tcp", addr) })
	return cfg.FormatDSN()
}

// slowConn is one connection through a Slow network.
type slowConn struct {
	net.Conn
	s *Slow

	mu       sync.Mutex
	replyDue bool      // a write was sent whose reply has not begun to be read
	deadline time.Time // the read deadline the client set
}

func (c *slowConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.replyDue = true
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *slowConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *slowConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *slowConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	due, deadline := c.replyDue && !c.s.Off.Load(), c.deadline
	c.replyDue = false
	c.mu.Unlock()
	if due {
		c.s.Delayed.Add(1)
		wait := c.s.delay()
		if !deadline.IsZero() && time.Until(deadline) < wait {
			time.Sleep(time.Until(deadline))
			return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		time.Sleep(wait)
	}
	return c.Conn.Read(b)
}
