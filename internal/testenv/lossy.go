package testenv

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Lossy is a network between the tests and MySQL that can lose a reply: the first write that
// contains an armed marker is sent, the connection waits until the server has run all of it
// (every statement of a multi-statement script, its COMMIT included), and then either closes
// (the reply is lost with the connection), returns late (the write outlives its caller's
// deadline), or closes and takes the network down (every later write and dial fails) until
// Restore.
//
// The wait is for the event, not a guess at how long the server takes: a fixed sleep that
// guessed short closed the connection while the script was still running (the commit had not
// happened when the caller saw the loss: another scenario than the test's), and one that
// guessed long slowed every test. A server that has not finished within LossyDeadline fails
// the test.
type Lossy struct {
	t     testing.TB
	watch *sql.DB // a plain connection, around the lossy network, that watches the server

	mu     sync.Mutex
	marker []byte
	mode   LossMode
	down   bool
	fired  int  // marked writes seen since the last Arm
	left   int  // marked writes still to lose; the marker is disarmed at 0
	ended  bool // the test has ended: a loss no longer reports to it
	limit  time.Duration
	late   time.Duration // how late a LateReply is: LateBy, or ArmLate's
	held   chan struct{} // ArmHeld's: a LateReply returns once this is closed, not after late
}

// LossMode is what happens after the marked write.
type LossMode int

const (
	LoseReply LossMode = iota // close the connection: the reply is lost
	LateReply                 // return late: the reply arrives after the caller's deadline
	GoDown                    // close, and fail every later write and dial until Restore
	// KilledReply keeps the connection and its reply but for the answer to the write's last
	// statement (a script's COMMIT), which becomes ER_QUERY_INTERRUPTED (1317): what MySQL 8
	// answers when a KILL QUERY lands as a COMMIT ends — the transaction committed, the
	// client told it was interrupted. The write must be statements that answer OK alone.
	KilledReply
	// NotReadyReply never sends the write: the server runs none of it, and the driver reads
	// ER_UNKNOWN_COM_ERROR (1047, SQLSTATE 08S01) "WSREP has not yet prepared node for
	// application use", what a Galera node answers every statement, before running it, while
	// it is out of its cluster's primary component or set to reject queries
	// (wsrep_reject_queries). The connection stays in step with the server, as the node's does.
	NotReadyReply
)

// LateBy is how late a LateReply is: its write returns no sooner than this after it was
// sent (and not before the server has run it). A caller whose deadline is shorter (say
// LateBy/2) gets its reply after that deadline. LoseReply and GoDown do not wait for it:
// they wait for the server only.
const LateBy = 300 * time.Millisecond

// LossyDeadline bounds the wait for the server to run a marked write; past it the test fails.
// A script that takes longer is stuck (a lock nobody releases), not slow.
const LossyDeadline = 10 * time.Second

var errNetworkDown = errors.New("testenv: lossy network down")

// LossyMySQLDSN is MySQLDSN on connections through a new Lossy network.
func LossyMySQLDSN(t testing.TB) (string, *Lossy) {
	t.Helper()
	cfg, err := mysql.ParseDSN(MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	plain := cfg.Clone()
	// The watcher asks only information_schema: it connects to no database, so that its own
	// PROCESSLIST polls are never among the test database's threads (DB = DATABASE()). The
	// server marks a thread "Sleep" only after it has sent the reply, so a poll that has just
	// returned can still show as "Query" to a test that checks the database is idle.
	plain.DBName = ""
	connector, err := mysql.NewConnector(plain)
	if err != nil {
		t.Fatal(err)
	}
	l := &Lossy{t: t, watch: sql.OpenDB(connector), limit: LossyDeadline}
	l.watch.SetMaxOpenConns(2)
	cfg.Net = "tg-lossy-" + RandomID(6)
	mysql.RegisterDialContext(cfg.Net, l.dial)
	t.Cleanup(func() {
		l.mu.Lock()
		l.ended = true
		l.mu.Unlock()
		l.Restore()
		l.watch.Close()
	})
	return cfg.FormatDSN(), l
}

// Arm makes the next write containing marker lose its reply as mode says.
func (l *Lossy) Arm(marker string, mode LossMode) { l.ArmN(marker, mode, 1) }

// ArmN makes the next n writes containing marker lose their replies as mode says: a retry
// whose own reply is lost again.
func (l *Lossy) ArmN(marker string, mode LossMode, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marker, l.mode, l.fired, l.left, l.late, l.held = []byte(marker), mode, 0, n, LateBy, nil
}

// ArmLate makes the next write containing marker a LateReply late by by instead of LateBy: a
// test whose caller's deadline must leave room for the steps before the write on a loaded
// machine (seconds, not LateBy/2) still gets the reply after that deadline when by is at
// least the deadline's length.
func (l *Lossy) ArmLate(marker string, by time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marker, l.mode, l.fired, l.left, l.late, l.held = []byte(marker), LateReply, 0, 1, by, nil
}

// ArmHeld makes the next write containing marker a LateReply whose reply is held until release
// is called (or the test ends), however long that is: a test that must show its caller was
// answered before the database's reply came back checks that while the reply is still held,
// rather than measuring how long the answer took against a fixed lateness.
func (l *Lossy) ArmHeld(marker string) (release func()) {
	held := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	l.t.Cleanup(release)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marker, l.mode, l.fired, l.left, l.late, l.held = []byte(marker), LateReply, 0, 1, 0, held
	return release
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

// TakeDown takes the network down, as a GoDown loss does after its write, but at once and with
// nothing written: every later write (on a connection the pool still holds) and dial fails,
// before a byte reaches the server, until Restore.
func (l *Lossy) TakeDown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = true
}

// Restore disarms and brings the network back up.
func (l *Lossy) Restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marker, l.down = nil, false
}

// fail reports a loss that could not be staged as asked. The write runs on the caller's
// goroutine, not the test's, so it marks the test failed (Errorf) rather than stopping it;
// after the test has ended there is nobody to tell.
func (l *Lossy) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.t.Errorf("%v", err)
	}
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
	lc := &lossyConn{Conn: c, l: l, r: bufio.NewReaderSize(c, 16<<10)}
	if err := lc.readThreadID(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return lc, nil
}

// lossyConn is one connection through a Lossy network. Its reads are served from r, so that
// the bytes read to learn the server's thread id and to see the reply begin still reach the
// driver.
type lossyConn struct {
	net.Conn
	l        *Lossy
	r        *bufio.Reader
	threadID uint32 // the server's id for this connection; 0 if its greeting was an error
}

func (c *lossyConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// readThreadID reads the connection id from the server's greeting (the first packet of a
// connection: a 4-byte header, protocol version 10, the server version NUL-terminated, then
// the id, 4 bytes little-endian), leaving the greeting in r for the driver. A greeting that
// is an error packet ("Too many connections") is left to the driver to report.
func (c *lossyConn) readThreadID(ctx context.Context) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(LossyDeadline)
	}
	if err := c.Conn.SetReadDeadline(deadline); err != nil {
		return err
	}
	defer c.Conn.SetReadDeadline(time.Time{})
	hdr, err := c.r.Peek(4)
	if err != nil {
		return fmt.Errorf("testenv: lossy: read the server's greeting: %w", err)
	}
	size := int(hdr[0]) | int(hdr[1])<<8 | int(hdr[2])<<16
	pkt, err := c.r.Peek(4 + size)
	if err != nil {
		return fmt.Errorf("testenv: lossy: read the server's greeting (%d bytes): %w", size, err)
	}
	p := pkt[4:]
	if len(p) == 0 || p[0] != 10 {
		return nil
	}
	end := bytes.IndexByte(p[1:], 0)
	if end < 0 || len(p) < 1+end+1+4 {
		return fmt.Errorf("testenv: lossy: a server greeting without a connection id: % x", p)
	}
	c.threadID = binary.LittleEndian.Uint32(p[1+end+1:])
	return nil
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
	mode, limit, marker, late, held := l.mode, l.limit, l.marker, l.late, l.held
	if hit {
		l.fired++
		if l.left--; l.left <= 0 {
			l.marker = nil
		}
	}
	l.mu.Unlock()
	if hit && mode == NotReadyReply {
		c.answerNotReady()
		return len(b), nil
	}
	n, err := c.Conn.Write(b)
	if !hit || err != nil {
		return n, err
	}
	sent := time.Now()
	if werr := c.awaitServer(limit); werr != nil {
		werr = fmt.Errorf("%w (the write marked %q)", werr, marker)
		l.fail(werr)
		c.Conn.Close()
		return n, werr
	}
	switch mode {
	case LoseReply:
		c.Conn.Close()
	case LateReply:
		if held != nil {
			<-held
		} else {
			time.Sleep(time.Until(sent.Add(late)))
		}
	case GoDown:
		l.mu.Lock()
		l.down = true
		l.mu.Unlock()
		c.Conn.Close()
	case KilledReply:
		if err := c.killLastAnswer(limit); err != nil {
			err = fmt.Errorf("testenv: lossy: %w (the write marked %q)", err, marker)
			l.fail(err)
			c.Conn.Close()
			return n, err
		}
	}
	return n, nil
}

// killLastAnswer reads the server's whole reply to a script of statements that answer OK
// alone (each OK but the last says more results follow), and leaves it for the driver with
// its last OK replaced by an ER_QUERY_INTERRUPTED error packet of the same sequence number.
func (c *lossyConn) killLastAnswer(limit time.Duration) error {
	if err := c.Conn.SetReadDeadline(time.Now().Add(limit)); err != nil {
		return err
	}
	defer c.Conn.SetReadDeadline(time.Time{})
	var reply []byte
	for {
		hdr := make([]byte, 4)
		if _, err := io.ReadFull(c.r, hdr); err != nil {
			return fmt.Errorf("read the reply: %w", err)
		}
		payload := make([]byte, int(hdr[0])|int(hdr[1])<<8|int(hdr[2])<<16)
		if _, err := io.ReadFull(c.r, payload); err != nil {
			return fmt.Errorf("read the reply: %w", err)
		}
		more, err := okMoreResults(payload)
		if err != nil {
			return err
		}
		if more {
			reply = append(append(reply, hdr...), payload...)
			continue
		}
		msg := "#70100Query execution was interrupted"
		errPkt := append([]byte{0xff, byte(1317 & 0xff), byte(1317 >> 8)}, msg...)
		reply = append(reply, byte(len(errPkt)), byte(len(errPkt)>>8), byte(len(errPkt)>>16), hdr[3])
		reply = append(reply, errPkt...)
		break
	}
	c.r = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(reply), c.Conn), 16<<10)
	return nil
}

// answerNotReady leaves for the driver, in place of the reply to a command the server never
// received, the error packet a Galera node not ready answers it (see NotReadyReply): the
// reply's first packet, sequence number 1.
func (c *lossyConn) answerNotReady() {
	errPkt := append([]byte{0xff, byte(1047 & 0xff), byte(1047 >> 8)}, "#08S01WSREP has not yet prepared node for application use"...)
	reply := append([]byte{byte(len(errPkt)), byte(len(errPkt) >> 8), byte(len(errPkt) >> 16), 1}, errPkt...)
	c.r = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(reply), c.r), 16<<10)
}

// okMoreResults reads an OK packet's status flags: whether more results follow it
// (SERVER_MORE_RESULTS_EXISTS). Any other packet is an error here.
func okMoreResults(p []byte) (bool, error) {
	if len(p) < 7 || p[0] != 0x00 {
		return false, fmt.Errorf("a reply packet that is no OK: % x", p[:min(len(p), 16)])
	}
	i := 1
	for range 2 { // affected rows, last insert id: length-encoded integers
		switch b := p[i]; {
		case b < 0xfb:
			i++
		case b == 0xfc:
			i += 3
		case b == 0xfd:
			i += 4
		default:
			i += 9
		}
		if i+2 > len(p) {
			return false, fmt.Errorf("a short OK packet: % x", p)
		}
	}
	status := binary.LittleEndian.Uint16(p[i:])
	return status&0x0008 != 0, nil
}

// awaitServer waits, at most limit, until the server has run all of the write just sent: it
// has begun to reply (a byte is readable: the write has reached the server and its first
// statement has run), and then its thread is idle again ("Sleep": the server sets that only
// once the whole command — every statement of a multi-statement script, its COMMIT included
// — is done and its last reply sent). The reply stays unread in r for the driver.
//
// The reply is not read while the server runs: one larger than the sockets' buffers would
// block the server, and end in the deadline. The replies of the marked writes in these tests
// are a few OK packets and small result sets.
//
// If the connection is closed meanwhile (its caller gave up, and the driver closed it; or the
// server closed it), the server ends the thread once it is done with the write: the thread's
// end is the wait's end then ("Sleep" may be the moment before the server read the write).
func (c *lossyConn) awaitServer(limit time.Duration) error {
	if c.threadID == 0 {
		return errors.New("testenv: lossy: a marked write on a connection whose server thread is unknown")
	}
	deadline := time.Now().Add(limit)
	if err := c.Conn.SetReadDeadline(deadline); err != nil {
		return fmt.Errorf("testenv: lossy: %w", err)
	}
	_, perr := c.r.Peek(1)
	// The driver sets its own read deadline, if it has one, before it reads.
	_ = c.Conn.SetReadDeadline(time.Time{})
	var ne net.Error
	if errors.As(perr, &ne) && ne.Timeout() {
		return fmt.Errorf("testenv: lossy: no reply to the marked write from server thread %d within %v", c.threadID, limit)
	}
	closed := perr != nil
	// The watching queries get time of their own past the deadline, so that a server still at
	// the write at the deadline is reported as that, not as a query cut short.
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(5*time.Second))
	defer cancel()
	q := fmt.Sprintf("SELECT COMMAND FROM information_schema.PROCESSLIST WHERE ID = %d", c.threadID)
	for {
		var command string
		err := c.l.watch.QueryRowContext(ctx, q).Scan(&command)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil // the thread has ended
		case err != nil:
			return fmt.Errorf("testenv: lossy: watch server thread %d run the marked write: %w", c.threadID, err)
		case command == "Sleep" && !closed:
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: lossy: server thread %d still %q on the marked write after %v", c.threadID, command, limit)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
