package e2e

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/holds"
)

// stopRelay is a TCP relay between a gateway and MariaDB that, once armed, SIGSTOPs the server (or,
// armToStop, the gateway) the moment a client sends a batch's closing script (a write ending in
// COMMIT) of the kind it is armed for, before that write is passed on: the script lands in the
// socket buffer of a stopped server, which runs it when it is resumed — whether or not the
// gateway has given up on it by then.
type stopRelay struct {
	ln     net.Listener
	target string
	pid    int
	mu     sync.Mutex
	armed  bool
	// kind is what the closing script to stop on holds, one of (admissionScript, settlementScript): a
	// gateway's background passes (its reconciler's, its session prune) close scripts too, and
	// one of those, caught first on a busy machine, stopped the server before the call's.
	kind  [][]byte
	fired chan struct{}
	// atCommitAfter: stop at the COMMIT that ends a transaction one of whose earlier
	// statements held kind (armToStopAtCommitAfter), not only at a closing script holding it.
	atCommitAfter bool
	// dropBeats: a gateway's heartbeat (UPDATE instances SET beat_at) cuts its connection
	// before it reaches the server, as a beat that fails does; its other statements pass.
	dropBeats atomic.Bool
}

func newStopRelay(t *testing.T, target string, pid int) *stopRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &stopRelay{ln: ln, target: target, pid: pid, fired: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go r.pipe(c, s, true)
			go r.pipe(s, c, false)
		}
	}()
	return r
}

func (r *stopRelay) addr() string { return r.ln.Addr().String() }

// The closing scripts a stopRelay is armed for, by what one of them holds: an admission's (a
// fresh run's hold, or a named run's admitted again), and a settlement's (a run charged to
// its day).
var (
	admissionScript  = [][]byte{[]byte("INSERT INTO run_holds (run_id, user_id, client_run_id"), []byte("UPDATE run_holds SET expires_at = GREATEST")}
	settlementScript = [][]byte{[]byte("INSERT INTO usage_days")}
)

// arm makes the next closing script holding kind stop the server; the channel closes once it
// has.
func (r *stopRelay) arm(kind [][]byte) <-chan struct{} { return r.armToStop(r.pid, kind) }

// armToStop makes the next closing script holding kind stop the process pid (the server, or
// the gateway that sends it: the script then reaches the server, which commits, and its answer
// waits for a stopped process); the channel closes once it has.
func (r *stopRelay) armToStop(pid int, kind [][]byte) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed, r.pid, r.kind, r.atCommitAfter = true, pid, kind, false
	return r.fired
}

// armToStopAtCommitAfter makes the COMMIT of the next transaction that sent a statement holding
// kind stop the process pid, as armToStop does a closing script: a transaction whose COMMIT
// goes out alone (holds.Store's, a session claim's), committed by the server while its
// sender is stopped.
func (r *stopRelay) armToStopAtCommitAfter(pid int, kind [][]byte) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed, r.pid, r.kind, r.atCommitAfter = true, pid, kind, true
	return r.fired
}

func (r *stopRelay) pipe(from, to net.Conn, fromClient bool) {
	defer from.Close()
	defer to.Close()
	buf := make([]byte, 64<<10)
	sentKind := false // this connection's transaction sent a statement holding kind (atCommitAfter)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if fromClient && r.dropBeats.Load() && bytes.Contains(buf[:n], []byte("UPDATE instances SET beat_at")) {
				return
			}
			if fromClient {
				r.mu.Lock()
				commit := bytes.HasSuffix(bytes.TrimRight(buf[:n], "; \n\x00"), []byte("COMMIT"))
				sentKind = sentKind || (r.armed && r.atCommitAfter && holdsAny(buf[:n], r.kind))
				if r.armed && commit && (holdsAny(buf[:n], r.kind) || (r.atCommitAfter && sentKind)) {
					r.armed = false
					if err := syscall.Kill(r.pid, syscall.SIGSTOP); err == nil {
						close(r.fired)
					}
				}
				if commit || bytes.HasSuffix(bytes.TrimRight(buf[:n], "; \n\x00"), []byte("ROLLBACK")) {
					sentKind = false
				}
				r.mu.Unlock()
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// holdsAny reports whether b holds one of subs.
func holdsAny(b []byte, subs [][]byte) bool {
	for _, sub := range subs {
		if bytes.Contains(b, sub) {
			return true
		}
	}
	return false
}

// dsnViaAddr is the world's DSN through addr.
func (w *world) dsnViaAddr(addr string) string {
	w.t.Helper()
	cfg, err := mysql.ParseDSN(w.dsn)
	if err != nil {
		w.t.Fatal(err)
	}
	cfg.Addr = addr
	return cfg.FormatDSN()
}

// TestGatewayPausedBetweenItsHoldAndTheForward: a gateway is paused (SIGSTOP) the moment its
// admission's closing script goes out — the server commits the hold; the gateway has not yet
// read that it did — for longer than the hold lives and than admit_timeout, while a peer serves
// and reconciles. The hold has no lease (none is written before the first beat) and no tally,
// so the peer's reconciler charges it what it held (DESIGN §5 rule 3), as it would a killed
// process's. Resumed, the gateway finds its call's admission budget spent: refused so, the
// caller was answered 503 billing_unavailable, "not made, retry shortly", with its hold released
// at 0 — a release that changed nothing, the hold charged — and its retry was charged again.
// The call it paid for must be forwarded instead, as one the pause caught just after its
// forward is, and the books stay whole.
func TestGatewayPausedBetweenItsHoldAndTheForward(t *testing.T) {
	w := newWorld(t)
	relay := newStopRelay(t, w.mysqlAddr(), 0)
	u, key := w.user("paused-before-forward", 10, nil)
	g := w.startGatewayWith("gw-paused", w.config, "MYSQL_DSN="+w.dsnViaAddr(relay.addr()))
	w.startGateway("gw-peer")
	var all allCalls
	stopped := false
	defer func() {
		if stopped {
			_ = g.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	body := chatRequest(false, 40, "the call whose gateway the pause catches")
	fired := relay.armToStop(g.cmd.Process.Pid, admissionScript)
	first := make(chan seen, 1)
	go func() { first <- all.call(g, key, body, map[string]string{"X-Fake-Chunks": "12"}) }()
	select {
	case <-fired:
	case <-time.After(20 * time.Second):
		t.Fatal("no closing script went out to stop the gateway on")
	}
	stopped = true
	pausedAt := time.Now()
	var runID string
	waitFor(t, 10*time.Second, "the hold committed", func() bool {
		_ = w.db.Get(&runID, "SELECT COALESCE(MAX(run_id), '') FROM run_holds WHERE user_id = ?", u.ID)
		return runID != ""
	})
	waitFor(t, 30*time.Second, "the peer's reconciler to settle the paused process's hold", func() bool {
		return w.hold(runID).State == holds.StateSettled
	})
	r := w.hold(runID)
	t.Logf("settled under the paused gateway: %s charged %d (held %d)", r.SettleSource.String, r.ChargedMicro, r.HeldMicro)
	// Past the call's admission budget (admit_timeout, 5 s): resumed, it is not forwarded.
	waitFor(t, 20*time.Second, "the pause to outlast admit_timeout", func() bool { return time.Since(pausedAt) > 6*time.Second })
	if err := g.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	var s1 seen
	select {
	case s1 = <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("no answer within 30s of the resume")
	}
	t.Logf("the caller got: %d %s complete %v (run %s)", s1.status, s1.code, s1.complete, s1.runID)
	if !s1.complete {
		t.Errorf("the caller was answered %d %s (the upstream got %d calls), its hold charged %d by %s: charged for a call it was told was not made",
			s1.status, s1.code, w.held.calls.Load(), r.ChargedMicro, r.SettleSource.String)
	}
	if after := w.hold(runID); after.ChargedMicro != r.ChargedMicro || after.SettleSource != r.SettleSource || after.SettledAt != r.SettledAt {
		t.Errorf("the peer's settlement changed after the resume: %s charged %d, was %s charged %d", after.SettleSource.String, after.ChargedMicro, r.SettleSource.String, r.ChargedMicro)
	}
	waitFor(t, 20*time.Second, "every hold settled", func() bool { return w.liveHoldsOf(u.ID) == 0 })
	var total int64
	if err := w.db.Get(&total, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if used := w.ledgerUsed(u.ID); used != total || total != r.ChargedMicro {
		t.Errorf("day ledger %d, Σ charged %d, want both the one hold charged, %d", used, total, r.ChargedMicro)
	}
	if bad, err := holds.Audit(context.Background(), w.db); err != nil || len(bad) > 0 {
		t.Errorf("ledger audit: %v %+v", err, bad)
	}
	all.mu.Lock()
	for _, s := range all.seen {
		if s.status >= 500 {
			t.Errorf("a caller got %d %s (run %s)", s.status, s.code, s.runID)
		}
	}
	all.mu.Unlock()
}
