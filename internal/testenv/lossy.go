package testenv

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Lossy is a network between the tests and MySQL that can lose a reply: the first write that
// contains an armed marker is sent, the connection waits while the server runs it, and then
// either closes (the reply is lost with the connection), returns late (the write outlives its
// caller's deadline), or closes and takes the network down (every later write and dial fails)
// until Restore.
type Lossy struct {
	mu     sync.Mutex
	marker []byte
	mode   LossMode
	down   bool
	fired  int // marked writes seen since the last Arm
}

// LossMode is what happens after the marked write.
type LossMode int

const (
	LoseReply LossMode = iota // close the connection: the reply is lost
	LateReply                 // return late: the reply arrives after the caller's deadline
	GoDown                    // close, and fail every later write and dial until Restore
)

// LossyWait is how long a marked write waits before its loss: time for the server to run it.
const LossyWait = 300 * time.Millisecond

var errNetworkDown = errors.New("testenv: lossy network down")

// LossyMySQLDSN is MySQLDSN on connections through a new Lossy network.
func LossyMySQLDSN(t testing.TB) (string, *Lossy) {
	t.Helper()
	cfg, err := mysql.ParseDSN(MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	l := &Lossy{}
	cfg.Net = "tg-lossy-" + RandomID(6)
	mysql.RegisterDialContext(cfg.Net, l.dial)
	t.Cleanup(l.Restore)
	return cfg.FormatDSN(), l
}

// Arm makes the next write containing marker lose its reply as mode says.
func (l *Lossy) Arm(marker string, mode LossMode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marker, l.mode, l.fired = []byte(marker), mode, 0
}

// Fired reports whether the armed loss happened: a test whose marker no longer matches
// anything would otherwise pass without testing anything.
func (l *Lossy) Fired() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fired > 0
}

// Down reports whether a GoDown loss has taken the network down.
func (l *Lossy) Down() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.down
}

// Restore disarms and brings the network back up.
func (l *Lossy) Restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marker, l.down = nil, false
}

func (l *Lossy) dial(ctx context.Context, addr string) (net.Conn, error) {
	l.mu.Lock()
	down := l.down
	l.mu.Unlock()
	if down {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errNetworkDown}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, l: l}, nil
}

type lossyConn struct {
	net.Conn
	l *Lossy
}

func (c *lossyConn) Write(b []byte) (int, error) {
	l := c.l
	l.mu.Lock()
	if l.down {
		l.mu.Unlock()
		c.Conn.Close()
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: errNetworkDown}
	}
	hit := l.marker != nil && bytes.Contains(b, l.marker)
	mode := l.mode
	if hit {
		l.marker = nil
		l.fired++
	}
	l.mu.Unlock()
	n, err := c.Conn.Write(b)
	if !hit {
		return n, err
	}
	time.Sleep(LossyWait)
	switch mode {
	case LoseReply:
		c.Conn.Close()
	case GoDown:
		l.mu.Lock()
		l.down = true
		l.mu.Unlock()
		c.Conn.Close()
	}
	return n, err
}
