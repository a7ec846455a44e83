package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestReconcileOnceLogsUnderItsOwnInstance: run where a serving gateway's environment is
// (TOLLGATE_INSTANCE naming that gateway), `reconcile -once` takes the lock under a name of its
// own (TestReconcileOnceInAGatewaysEnvironment), but its log lines still carried the
// gateway's name as their instance: the money lines of the runs it settled said that gateway
// settled them, and an operator tracing a charge looked at a process that never touched it.
// Its lines carry the name it runs under.
func TestReconcileOnceLogsUnderItsOwnInstance(t *testing.T) {
	useTestDatabase(t)
	useTestRedis(t)
	ctx := testCtx(t)
	t.Setenv("TOLLGATE_INSTANCE", "gw-a")
	if _, err := stdout(t, func() error { return userCreate(ctx, []string{"-name", "alice"}) }); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	if _, err := db.ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at)
		SELECT 'r_expired', id, 'running', 100, 100, 'm', NOW(6) - INTERVAL 1 HOUR FROM users`); err != nil {
		t.Fatal(err)
	}
	var out []byte
	lines := loggedLines(t, func() {
		var err error
		if out, err = stdout(t, func() error { return reconcileOnce(ctx, []string{"-once"}) }); err != nil {
			t.Errorf("reconcile -once: %v (%s)", err, out)
		}
	})
	settled := 0
	for _, l := range lines {
		if l["run_id"] == "r_expired" {
			settled++
		}
		// The pass's lines: the reconciler's and its store's (setup's, before the pass names
		// itself, say nothing of any run).
		if name, _ := l["logger"].(string); !strings.HasPrefix(name, "reconcile") && l["run_id"] == nil {
			continue
		}
		if inst, _ := l["instance"].(string); !strings.HasPrefix(inst, "gw-a/reconcile-once:") {
			t.Errorf("line %q of reconcile -once has instance %q, want its own (gw-a/reconcile-once:<pid>): %v", l["msg"], inst, l)
		}
	}
	if settled == 0 {
		t.Fatalf("no line names the run settled; printed %s, logged %v", out, lines)
	}
}

// loggedLines runs fn with os.Stderr, which the commands' logger writes to, captured, and
// returns the JSON lines written; a line that is not JSON fails the test.
func loggedLines(t *testing.T, fn func()) []map[string]any {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	done := make(chan []map[string]any)
	go func() {
		var lines []map[string]any
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var l map[string]any
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Errorf("stderr line is not JSON: %q", sc.Text())
				continue
			}
			lines = append(lines, l)
		}
		done <- lines
	}()
	fn()
	os.Stderr = saved
	w.Close()
	return <-done
}
