package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// dbRelay is a TCP relay between a gateway and MariaDB that acts on what the gateway writes,
// before passing it on, in the ways a test arms it for (none, unarmed: it only relays):
//
//   - armToStop, armToStopAtCommitAfter: SIGSTOP a process (the server, or the gateway) the
//     moment a client sends a batch's closing script (a write ending in COMMIT) of the kind it
//     is armed for, and pass the script on only once every thread of the process has stopped
//     (stopProcess). The script lands in the socket buffer of a stopped server, which runs it
//     when it is resumed — whether or not the gateway has given up on it by then; or it reaches
//     the server, which commits, and its answer waits for a stopped gateway.
//   - catchSettlements: hold back a settlement's first script, then SIGKILL the gateway on (or
//     hold back) the second.
//   - dropBeats: cut the connection that carries a heartbeat.
//
// freezer (every byte both ways, MariaDB or Redis) and tripwire (a reply lost) are the other
// relays: they act on the connection as a whole, this one on a client's write.
type dbRelay struct {
	t      *testing.T
	ln     net.Listener
	target string
	mu     sync.Mutex

	// The stop (armToStop, armToStopAtCommitAfter).
	stopArmed bool
	stopPid   int
	// kind is what the closing script to stop on holds, one of (admissionScript, settlementScript): a
	// gateway's background passes (its reconciler's, its session prune) close scripts too, and
	// one of those, caught first on a busy machine, stopped the server before the call's.
	kind  [][]byte
	fired chan struct{}
	// atCommitAfter: stop at the COMMIT that ends a transaction one of whose earlier
	// statements held kind (armToStopAtCommitAfter), not only at a closing script holding it.
	atCommitAfter bool

	// The settlements caught (catchSettlements): their scripts counted, from the first.
	settlePid int
	settled   int
	// stallSecond: the second script is held back as the first is, and the gateway not killed.
	stallSecond bool
	stalled     chan struct{} // closed once the first settlement's script is held back
	killed      chan struct{} // closed once the second's SIGKILLed the gateway (or was held back)
	killedOn    []byte        // the script the kill came on
	release     chan struct{} // closed (let) ends the stalled connections, their scripts dropped
	once        sync.Once

	// dropBeats: a gateway's heartbeat (UPDATE instances SET beat_at) cuts its connection
	// before it reaches the server, as a beat that fails does; its other statements pass.
	dropBeats atomic.Bool
}

func newDBRelay(t *testing.T, target string) *dbRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &dbRelay{t: t, ln: ln, target: target, fired: make(chan struct{}), stalled: make(chan struct{}),
		killed: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { r.let(); ln.Close() })
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

func (r *dbRelay) addr() string { return r.ln.Addr().String() }

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

// The closing scripts a dbRelay is armed to stop on, by what one of them holds: an admission's
// (a fresh run's hold, or a named run's admitted again), and a settlement's (a run charged to
// its day).
var (
	admissionScript  = [][]byte{[]byte("INSERT INTO run_holds (run_id, user_id, client_run_id"), []byte("UPDATE run_holds SET expires_at = GREATEST")}
	settlementScript = [][]byte{[]byte("INSERT INTO usage_days")}
)

// armToStop makes the next closing script holding kind stop the process pid (the server, or
// the gateway that sends it: the script then reaches the server, which commits, and its answer
// waits for a stopped process); the channel closes once it has, every thread of it stopped.
func (r *dbRelay) armToStop(pid int, kind [][]byte) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopArmed, r.stopPid, r.kind, r.atCommitAfter = true, pid, kind, false
	return r.fired
}

// armToStopAtCommitAfter makes the COMMIT of the next transaction that sent a statement holding
// kind stop the process pid, as armToStop does a closing script: a transaction whose COMMIT
// goes out alone (holds.Store's, a session claim's), committed by the server while its
// sender is stopped.
func (r *dbRelay) armToStopAtCommitAfter(pid int, kind [][]byte) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopArmed, r.stopPid, r.kind, r.atCommitAfter = true, pid, kind, true
	return r.fired
}

// catchSettlements makes the relay act, from now on, on the first script of a settlement's
// batch (the one that locks the holds it settles: "FROM run_holds WHERE run_id IN (…) FOR
// UPDATE"), before passing it on: the first such script is held back (its connection stalls,
// the server never sees it: nothing is locked, so the batches of other connections go on)
// until let; the second SIGKILLs the gateway pid and is dropped, or, stallSecond, is held back
// as the first is, the gateway not killed.
func (r *dbRelay) catchSettlements(pid int, stallSecond bool) {
	r.mu.Lock()
	r.settlePid, r.stallSecond = pid, stallSecond
	r.mu.Unlock()
}

// let ends the connections catchSettlements stalled.
func (r *dbRelay) let() { r.once.Do(func() { close(r.release) }) }

func (r *dbRelay) pipe(from, to net.Conn, fromClient bool) {
	defer from.Close()
	defer to.Close()
	buf := make([]byte, 64<<10)
	sentKind := false // this connection's transaction sent a statement holding kind (atCommitAfter)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if fromClient && !r.pass(buf[:n], &sentKind) {
				return
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

// pass reports whether the client's write b goes on to the server, once the relay has acted on
// it as armed; sentKind is the state of b's connection.
func (r *dbRelay) pass(b []byte, sentKind *bool) bool {
	if r.dropBeats.Load() && bytes.Contains(b, []byte("UPDATE instances SET beat_at")) {
		return false
	}
	if !r.passSettlement(b) {
		return false
	}
	r.stopOn(b, sentKind)
	return true
}

// stopOn stops the armed process if b is the closing script (or COMMIT) it is armed for.
func (r *dbRelay) stopOn(b []byte, sentKind *bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	commit := bytes.HasSuffix(bytes.TrimRight(b, "; \n\x00"), []byte("COMMIT"))
	*sentKind = *sentKind || (r.stopArmed && r.atCommitAfter && holdsAny(b, r.kind))
	if r.stopArmed && commit && (holdsAny(b, r.kind) || (r.atCommitAfter && *sentKind)) {
		r.stopArmed = false
		if err := stopProcess(r.stopPid); err != nil {
			r.t.Errorf("dbRelay: %v", err)
		} else {
			close(r.fired)
		}
	}
	if commit || bytes.HasSuffix(bytes.TrimRight(b, "; \n\x00"), []byte("ROLLBACK")) {
		*sentKind = false
	}
}

// stopProcess stops the process pid (SIGSTOP) and returns once every thread of it has stopped,
// so that the script the stop is on goes on to the server only then. kill only queues the
// signal: the thread it wakes to take it may wait for a CPU on a busy machine while the
// process's other threads run on, and a COMMIT passed on meanwhile was answered, the answer
// read, and the call forwarded and its usage tallied before the stop landed — the hold then
// settled by the peer's reconciler from the tally ("reconcile"), not as one never forwarded
// ("reconcile_hold"); a server stopped so could run the script before it stopped.
func stopProcess(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP %d: %w", pid, err)
	}
	// The wait is for the kernel to act on a signal already sent, which it does as soon as the
	// threads get a CPU: the bound only turns a process that never stops into a failure.
	deadline := time.Now().Add(10 * time.Second)
	for {
		stopped, err := allThreadsStopped(pid)
		if err != nil {
			return fmt.Errorf("process %d after its SIGSTOP: %w", pid, err)
		}
		if stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped 10s after its SIGSTOP", pid)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// allThreadsStopped reports whether every thread of pid is stopped (state T, or t under a
// tracer, from /proc) or gone: none of them runs again before a SIGCONT. The process's own
// state (/proc/pid/stat) is its first thread's alone, which may be stopped while others run.
func allThreadsStopped(pid int) (bool, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("threads: %w", err)
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the thread exited
		}
		if err != nil {
			return false, fmt.Errorf("thread %s: %w", task.Name(), err)
		}
		// "tid (comm) state …": comm may hold spaces and parentheses; the state follows the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) {
			return false, fmt.Errorf("thread %s: stat %q", task.Name(), stat)
		}
		switch stat[i+2] {
		case 'T', 't', 'Z', 'X':
		default:
			return false, nil
		}
	}
	return true, nil
}

// passSettlement reports whether b, if a settlement's first script, goes on to the server
// (catchSettlements): it stalls there until let, or kills the gateway, as armed.
func (r *dbRelay) passSettlement(b []byte) bool {
	if !bytes.Contains(b, []byte("FROM run_holds WHERE run_id IN (")) || !bytes.Contains(b, []byte("FOR UPDATE")) {
		return true
	}
	r.mu.Lock()
	if r.settlePid == 0 {
		r.mu.Unlock()
		return true
	}
	r.settled++
	switch r.settled {
	case 1:
		close(r.stalled)
		r.mu.Unlock()
		<-r.release
		return false
	case 2:
		if r.stallSecond {
			r.killedOn = append([]byte(nil), b...)
			close(r.killed)
			r.mu.Unlock()
			<-r.release
			return false
		}
		_ = syscall.Kill(r.settlePid, syscall.SIGKILL)
		r.killedOn = append([]byte(nil), b...)
		close(r.killed)
		r.mu.Unlock()
		return false
	}
	r.mu.Unlock()
	return true
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
