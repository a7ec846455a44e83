package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// LossyRedis is a network between a test's go-redis client and Redis that, once armed, loses
// the next writes containing a marker (a key, a script's SHA, an argument): either their
// replies (RedisReplyLost: Redis runs the write, then the connection is cut before the client
// reads the answer) or the writes themselves (RedisRequestLost: the connection is cut before
// they reach Redis). Either way the client then reads EOF, as from a server that closed the
// connection, and go-redis does what it does in production: it sends a lone command (a script
// included) again on a new connection, up to MaxRetries times, and fails a MULTI/EXEC at once.
// A third outcome, RedisWriteLate, delivers the write late instead: see LateWrite.
//
// A lost reply is lost only once Redis has answered every command of the write, its EXEC
// included: a reply read to the end is the event that the write has run, not a sleep guessing
// how long Redis takes. A write Redis does not answer within LossyDeadline fails the test.
type LossyRedis struct {
	t testing.TB

	mu     sync.Mutex
	marker []byte
	loss   RedisLoss
	left   int        // marked writes still to lose
	then   []lossyArm // armed in turn once left reaches 0 (ArmThen)
	fired  int        // marked writes lost since the last Arm
	ended  bool       // the test has ended: a loss no longer reports to it
	limit  time.Duration
	late   chan *LateWrite // held late, not yet taken by AwaitLate
	held   []*LateWrite    // every write held late: the test's end closes the undelivered
}

// lossyArm is one arming queued by ArmThen.
type lossyArm struct {
	marker []byte
	loss   RedisLoss
	times  int
}

// RedisLoss is what a LossyRedis loses of a marked write.
type RedisLoss int

const (
	RedisReplyLost   RedisLoss = iota // Redis runs the write; its reply is lost with the connection
	RedisRequestLost                  // the write never reaches Redis; the connection is cut
	// RedisWriteLate: the write reaches Redis late, after the client gave up on it. The client
	// sees nothing (no reply, no cut) until its own read deadline, then closes the connection
	// and goes on as in production (go-redis resends a lone command on a new connection, fails
	// a MULTI/EXEC); the write and the close are held back until the test Delivers the write,
	// which Redis then runs after whatever the client did meanwhile: a delayed TCP segment.
	// A client with no read deadline (read_timeout=-1, a context without one) waits until the
	// test ends.
	RedisWriteLate
)

// lateQueue bounds the writes held late and not yet taken by AwaitLate.
const lateQueue = 64

// NewLossyRedis returns a lossy network, disarmed. Its Dial is a redis.Options.Dialer.
func NewLossyRedis(t testing.TB) *LossyRedis {
	l := &LossyRedis{t: t, limit: LossyDeadline, late: make(chan *LateWrite, lateQueue)}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.ended, l.marker = true, nil
		for _, w := range l.held {
			w.conn.Close() // never delivered: it is lost after all
		}
	})
	return l
}

// LossyRedisOptions are the options of the test Redis (RedisURL) as the gateway sets them
// (cmd/gateway redisOptions: its calls' context deadlines bound them; go-redis's own retries,
// MaxRetries 3, stand), dialing through a new LossyRedis.
func LossyRedisOptions(t testing.TB) (*redis.Options, *LossyRedis) {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatalf("parse TOLLGATE_TEST_REDIS_URL: %v", err)
	}
	l := NewLossyRedis(t)
	opt.ContextTimeoutEnabled = true
	opt.Dialer = l.Dial
	return opt, l
}

// Arm makes the next times writes containing marker lose what loss says. go-redis sends a
// command whose reply it lost up to MaxRetries times more: times MaxRetries+1 loses every
// attempt of one command, which then fails.
func (l *LossyRedis) Arm(marker string, loss RedisLoss, times int) {
	if marker == "" || times < 1 {
		panic(fmt.Sprintf("testenv: lossy redis armed with marker %q, %d times", marker, times))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marker, l.loss, l.left, l.fired, l.then = []byte(marker), loss, times, 0, nil
}

// ArmThen queues an arming that takes over once the current one (Arm's, or the previous
// ArmThen's) has lost all its writes: a write whose reply is lost, then the next ones lost
// before they reach Redis. Fired counts the losses of the whole chain.
func (l *LossyRedis) ArmThen(marker string, loss RedisLoss, times int) {
	if marker == "" || times < 1 {
		panic(fmt.Sprintf("testenv: lossy redis armed with marker %q, %d times", marker, times))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.then = append(l.then, lossyArm{[]byte(marker), loss, times})
}

// Disarm loses nothing more.
func (l *LossyRedis) Disarm() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marker, l.left, l.then = nil, 0, nil
}

// Fired is how many marked writes were lost since Arm: a test whose marker no longer matches
// anything would otherwise pass without testing anything.
func (l *LossyRedis) Fired() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fired
}

// Dial connects to Redis through the lossy network.
func (l *LossyRedis) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lossyRedisConn{Conn: c, l: l}, nil
}

// fail reports a loss that could not be staged as asked. The write runs on the client's
// goroutine, not the test's, so it marks the test failed rather than stopping it.
func (l *LossyRedis) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.t.Errorf("%v", err)
	}
}

// take reports whether the write b is one to lose, and counts it.
func (l *LossyRedis) take(b []byte) (hit bool, loss RedisLoss, limit time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left == 0 || !bytes.Contains(b, l.marker) {
		return false, 0, 0
	}
	l.left--
	l.fired++
	loss = l.loss
	if l.left == 0 && len(l.then) > 0 {
		next := l.then[0]
		l.then = l.then[1:]
		l.marker, l.loss, l.left = next.marker, next.loss, next.times
	}
	return true, loss, l.limit
}

// lossyRedisConn is one connection through a LossyRedis. Once cut it reads EOF.
type lossyRedisConn struct {
	net.Conn
	l    *LossyRedis
	cut  atomic.Bool
	late atomic.Pointer[LateWrite] // the write held late on it, if any
}

// Close closes the connection, but for one with a write held late: its close waits for the
// write, as a FIN behind a delayed segment does.
func (c *lossyRedisConn) Close() error {
	if w := c.late.Load(); w != nil {
		w.gone.Do(func() { close(w.clientGone) })
		return nil
	}
	return c.Conn.Close()
}

func (c *lossyRedisConn) Read(b []byte) (int, error) {
	if c.cut.Load() {
		return 0, io.EOF
	}
	return c.Conn.Read(b)
}

func (c *lossyRedisConn) Write(b []byte) (int, error) {
	if c.cut.Load() {
		return 0, io.EOF
	}
	if w := c.late.Load(); w != nil {
		w.add(b) // behind the held write, held with it
		return len(b), nil
	}
	hit, loss, limit := c.l.take(b)
	if !hit {
		return c.Conn.Write(b)
	}
	if loss == RedisWriteLate {
		c.holdLate(b, limit)
		return len(b), nil
	}
	c.cut.Store(true)
	defer c.Conn.Close()
	if loss == RedisRequestLost {
		return len(b), nil
	}
	n, err := c.Conn.Write(b)
	if err != nil {
		return n, err
	}
	if err := c.awaitReplies(b, limit); err != nil {
		c.l.fail(err)
	}
	return n, nil
}

// awaitReplies reads, within limit, Redis's answer to every command of the write b: then all
// of it has run (a MULTI/EXEC's EXEC included). The answer is read off the connection, which is
// closed next: the client never sees it.
func (c *lossyRedisConn) awaitReplies(b []byte, limit time.Duration) error {
	return awaitReplies(c.Conn, b, limit)
}

// awaitReplies reads off conn, within limit, Redis's answer to every command of the write b.
func awaitReplies(conn net.Conn, b []byte, limit time.Duration) error {
	sent, err := respCommands(b)
	if err != nil {
		return err
	}
	if err := conn.SetReadDeadline(time.Now().Add(limit)); err != nil {
		return fmt.Errorf("testenv: lossy redis: %w", err)
	}
	r := bufio.NewReader(conn)
	for got := 0; got < sent; {
		push, err := skipRESP(r)
		if err != nil {
			return fmt.Errorf("testenv: lossy redis: %d of the %d replies to the marked write read within %v: %w", got, sent, limit, err)
		}
		if !push {
			got++
		}
	}
	return nil
}

// LateWrite is a write held back by RedisWriteLate: Redis has not seen it until Deliver.
type LateWrite struct {
	l          *LossyRedis
	conn       net.Conn // the connection to Redis the client wrote it on, kept open
	limit      time.Duration
	mu         sync.Mutex
	b          []byte
	gone       sync.Once
	clientGone chan struct{} // closed once the client closed the connection
	delivered  bool
}

// holdLate holds the write b, and the connection's close, back from Redis.
func (c *lossyRedisConn) holdLate(b []byte, limit time.Duration) {
	w := &LateWrite{l: c.l, conn: c.Conn, limit: limit, b: bytes.Clone(b), clientGone: make(chan struct{})}
	c.late.Store(w)
	c.l.mu.Lock()
	c.l.held = append(c.l.held, w)
	c.l.mu.Unlock()
	select {
	case c.l.late <- w:
	default:
		c.l.fail(fmt.Errorf("testenv: lossy redis: more than %d writes held late and not awaited", lateQueue))
	}
}

func (w *LateWrite) add(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, b...)
}

// AwaitLate returns the next write held late (RedisWriteLate), waiting for it to be written:
// the event that the client has sent it, not a guess. None within LossyDeadline fails the
// test. Call it from the test's goroutine.
func (l *LossyRedis) AwaitLate() *LateWrite {
	l.t.Helper()
	select {
	case w := <-l.late:
		return w
	case <-time.After(l.limit):
		l.t.Fatalf("testenv: lossy redis: no write held late within %v", l.limit)
		return nil
	}
}

// Deliver sends the held write to Redis on its own connection, once the client has given up
// on it (closed the connection after its read deadline), and returns once Redis has answered
// every command of it: it has run, after everything the client did since. The answer is
// discarded, the connection closed. A client still waiting within LossyDeadline, or a Redis
// that does not answer, fails the test. Call it from the test's goroutine.
func (w *LateWrite) Deliver() {
	w.l.t.Helper()
	if err := w.deliver(); err != nil {
		w.l.t.Fatalf("%v", err)
	}
}

func (w *LateWrite) deliver() error {
	select {
	case <-w.clientGone:
	case <-time.After(w.limit):
		return fmt.Errorf("testenv: lossy redis: the client still waits on the write held late after %v", w.limit)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.delivered {
		return errors.New("testenv: lossy redis: a write held late delivered twice")
	}
	w.delivered = true
	defer w.conn.Close()
	if err := w.conn.SetWriteDeadline(time.Now().Add(w.limit)); err != nil {
		return fmt.Errorf("testenv: lossy redis: deliver late: %w", err)
	}
	if _, err := w.conn.Write(w.b); err != nil {
		return fmt.Errorf("testenv: lossy redis: deliver late: %w", err)
	}
	return awaitReplies(w.conn, w.b, w.limit)
}

// respCommands counts the commands (RESP arrays) of a write.
func respCommands(b []byte) (int, error) {
	r := bufio.NewReader(bytes.NewReader(b))
	n := 0
	for {
		if _, err := r.Peek(1); errors.Is(err, io.EOF) {
			return n, nil
		}
		if _, err := skipRESP(r); err != nil {
			return 0, fmt.Errorf("testenv: lossy redis: a marked write that is not whole RESP commands: %w", err)
		}
		n++
	}
}

// maxRESPDepth bounds skipRESP's nesting: a reply nested deeper is not one of these tests'.
const maxRESPDepth = 32

// skipRESP reads one RESP2 or RESP3 value (a push, which is not a reply, says so).
func skipRESP(r *bufio.Reader) (push bool, err error) {
	return skipRESPValue(r, 0)
}

func skipRESPValue(r *bufio.Reader, depth int) (push bool, err error) {
	if depth > maxRESPDepth {
		return false, errors.New("RESP nested too deep")
	}
	line, err := r.ReadSlice('\n')
	if err != nil {
		return false, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return false, fmt.Errorf("malformed RESP line %q", line)
	}
	kind := line[0]
	switch kind {
	case '+', '-', ':', '_', ',', '#', '(':
		return false, nil
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil {
		return false, fmt.Errorf("malformed RESP length %q", line)
	}
	switch kind {
	case '$', '!', '=':
		if n >= 0 {
			_, err = r.Discard(n + 2)
		}
		return false, err
	case '*', '~', '>', '%', '|':
		if kind == '%' || kind == '|' {
			n *= 2
		}
		for range max(n, 0) {
			if _, err := skipRESPValue(r, depth+1); err != nil {
				return false, err
			}
		}
		if kind == '|' { // attributes come before the reply they describe
			return skipRESPValue(r, depth+1)
		}
		return kind == '>', nil
	}
	return false, fmt.Errorf("unknown RESP type %q", kind)
}
