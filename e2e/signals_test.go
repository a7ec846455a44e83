package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// unhurriedDrain is the shutdown_timeout of the gateways here, whose streams in flight must
// finish inside the drain: the drain ends when they do, and with the suite's 2 s a 2 s stream
// started just before the signal was cut at the deadline on a loaded machine.
const unhurriedDrain = 30 * time.Second

// TestSighupDrainsAsSigtermDoes: the terminal or SSH session that ran the gateway goes away
// (SIGHUP). Left to Go's default it killed the process on the spot: its calls in flight were
// settled by another process's reconciler at their whole hold. It drains instead: the stream
// in flight finishes, is charged what it used, and the process exits 0 with its row retired.
func TestSighupDrainsAsSigtermDoes(t *testing.T) {
	// A test run under nohup ignores SIGHUP, and the gateway it starts would inherit that and
	// keep ignoring it, as it is meant to (shutdownSignals). Handled here, SIGHUP reaches the
	// gateway at its default: exec resets a handled signal, never an ignored one.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	w := newWorld(t)
	_, key := w.user("hangup", 10, nil)
	g := w.startGatewayWith("gw-hangup", w.writeConfig(map[string]string{"limits.shutdown_timeout": unhurriedDrain.String()}))
	s := startStream(t, g, key, 20, 50*time.Millisecond, nil)
	g.signal(t, syscall.SIGHUP)
	if err := g.wait(t, unhurriedDrain+15*time.Second); err != nil {
		t.Fatalf("gateway exit after SIGHUP: %v, want status 0 after a drain", err)
	}
	<-s.done
	if r := w.hold(s.runID); s.err != nil || s.chunks < 20 || r.SettleSource.String != holds.SourceComplete {
		t.Errorf("stream in flight at SIGHUP: client read %d events (err %v), settled by %q; want it finished and settled complete",
			s.chunks, s.err, r.SettleSource.String)
	}
	w.settledAtPrice(t, s.runID, holds.SourceComplete, 20) // charged what it used
	var live int
	if err := w.db.Get(&live, "SELECT COUNT(*) FROM instances WHERE name = ? AND dead_at IS NULL", "gw-hangup"); err != nil {
		t.Fatal(err)
	}
	if live != 0 {
		t.Errorf("the gateway's row is not retired after its drain")
	}
}

// TestBrokenLogPipeDoesNotKillTheGateway: the gateway's log is read through a pipe (`make run
// | tee`, a log shipper) whose reader goes away. Go kills a process that writes to a broken
// pipe on its standard output or error, so the next log line killed it mid-call, its calls
// charged their whole hold by a reconciler later. The writes fail instead; the gateway serves
// on, and a SIGTERM drains it as usual.
func TestBrokenLogPipeDoesNotKillTheGateway(t *testing.T) {
	w := newWorld(t)
	_, key := w.user("piped", 10, nil)
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(rd)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	g := w.startGatewayLogTo("gw-piped", w.writeConfig(map[string]string{"limits.shutdown_timeout": unhurriedDrain.String()}), wr)
	wr.Close() // the gateway holds its own copy
	s := startStream(t, g, key, 40, 50*time.Millisecond, nil)
	rd.Close() // the reader goes away

	// Each wrong key writes a line ("request refused"): the first write to the broken pipe.
	for range 5 {
		req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(string(chatBody(false, 5, "hi"))))
		req.Header.Set("Authorization", "Bearer tg_not_a_key")
		if resp, err := http.DefaultClient.Do(req); err != nil {
			t.Fatalf("request after the log's reader left: %v (the gateway died?)", err)
		} else {
			resp.Body.Close()
		}
	}
	select {
	case <-g.done:
		t.Fatalf("the gateway died once its log's reader left: %v", g.err)
	default:
	}
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, unhurriedDrain+15*time.Second); err != nil {
		t.Fatalf("gateway exit after SIGTERM: %v, want status 0 after a drain", err)
	}
	<-s.done
	if r := w.hold(s.runID); s.err != nil || s.chunks < 40 || r.SettleSource.String != holds.SourceComplete {
		t.Errorf("stream in flight: client read %d events (err %v), settled by %q; want it finished and settled complete",
			s.chunks, s.err, r.SettleSource.String)
	}
	w.settledAtPrice(t, s.runID, holds.SourceComplete, 40)
}

// TestStartOnATakenPortLeavesNoInstanceRow: a gateway that cannot listen (its port taken)
// exits before it registers: it served nothing, and a row of it would be found dead by the
// other processes a minute and a half later and counted in tollgate_dead_instances_total — on
// every try of a restart loop.
func TestStartOnATakenPortLeavesNoInstanceRow(t *testing.T) {
	w := newWorld(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cmd := testenv.DiesWithTests(exec.Command(gatewayBin, "serve", "-config", w.config))
	cmd.Env = w.gatewayEnv("gw-port-taken", taken.Addr().String())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "address already in use") {
		t.Fatalf("gateway on a taken port: %v\n%s\nwant it to exit saying the address is in use", err, tail(out, 2000))
	}
	var rows int
	if err := w.db.Get(&rows, "SELECT COUNT(*) FROM instances WHERE name = ?", "gw-port-taken"); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("%d instance rows of a gateway that never listened, want none", rows)
	}
}

// TestNohupGatewayKeepsIgnoringHangup: a gateway started under nohup (SIGHUP ignored) keeps it
// ignored — asking to be told of SIGHUP would undo nohup, and the session's end would drain
// and stop a gateway meant to outlive it. SIGTERM still drains it.
func TestNohupGatewayKeepsIgnoringHangup(t *testing.T) {
	w := newWorld(t)
	logf, err := os.Create(filepath.Join(t.TempDir(), "nohup.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := testenv.DiesWithTests(exec.Command("nohup", gatewayBin, "serve", "-config", w.config))
	cmd.Env = w.gatewayEnv("gw-nohup", anyPort)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := &gateway{name: "gw-nohup", cmd: cmd, log: logf.Name(), done: make(chan struct{})}
	go func() { g.err = cmd.Wait(); close(g.done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-g.done })
	addr, err := listenedAt(g.log, "gateway listening", g.done, 20*time.Second)
	if err != nil {
		b, _ := os.ReadFile(g.log)
		t.Fatalf("the gateway under nohup: %v\n%s", err, tail(b, 4000))
	}
	g.url = "http://" + addr
	waitFor(t, 20*time.Second, "the gateway under nohup ready", func() bool {
		resp, err := http.Get(g.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// The kernel's own word on the process's signals: SIGHUP (bit 0) still ignored.
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var ignored uint64
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			if ignored, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ignored&(1<<(syscall.SIGHUP-1)) == 0 {
		t.Errorf("SIGHUP no longer ignored in a gateway started under nohup (SigIgn %x)", ignored)
	}
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, testShutdownDrain+15*time.Second); err != nil {
		t.Errorf("gateway exit after SIGTERM: %v, want status 0", err)
	}
}
