package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestUserSetCommand: `gateway user set` changes a plan and overrides together or not at all,
// and "none" drops an override so the plan's figure applies again.
func TestUserSetCommand(t *testing.T) {
	w := newWorld(t)
	w.user("cli-user", 10, nil)
	run := func(args ...string) (map[string]any, error) {
		t.Helper()
		cmd := exec.Command(gatewayBin, append([]string{"user", "set", "-config", w.config, "-name", "cli-user"}, args...)...)
		cmd.Env = append(os.Environ(), "MYSQL_DSN="+w.dsn, "REDIS_URL="+testenv.RedisURL(t), "UPSTREAM_URL="+w.upstream.URL,
			"TOLLGATE_INSTANCE=operator", "TOLLGATE_REDIS_PREFIX="+w.prefix)
		out, err := cmd.Output()
		if err != nil {
			return nil, err
		}
		var v map[string]any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("user set %v printed %s: %v", args, out, err)
		}
		return v, nil
	}
	overrides := func(v map[string]any) map[string]any {
		o, _ := v["overrides"].(map[string]any)
		return o
	}
	v, err := run("-allowance", "7", "-max-in-flight", "3")
	if err != nil {
		t.Fatal(err)
	}
	if o := overrides(v); o["allowance"] != "7" && o["allowance"] != float64(7) || o["max_in_flight"] != float64(3) {
		t.Fatalf("after setting overrides: %v", o)
	}
	// An allowance finer than a micro-USD says how fine an amount may be.
	if _, err := run("-allowance", "0.0001"); err == nil {
		t.Fatal("user set -allowance 0.0001 succeeded")
	} else if ee, ok := err.(*exec.ExitError); !ok || !strings.Contains(string(ee.Stderr), "steps of 0.001") {
		t.Errorf("user set -allowance 0.0001: %v, want it to name the step, 0.001 credits", err)
	}
	// A bad figure beside a good one changes nothing: the row is as it was before the command.
	type limits struct {
		Allowance   *int64 `db:"allowance_micro"`
		MaxInFlight *int   `db:"max_in_flight"`
	}
	row := func() limits {
		t.Helper()
		var l limits
		if err := w.db.Get(&l, "SELECT allowance_micro, max_in_flight FROM users WHERE name = 'cli-user'"); err != nil {
			t.Fatal(err)
		}
		if l.Allowance == nil || l.MaxInFlight == nil {
			t.Fatalf("cli-user's overrides: allowance %v max_in_flight %v, want both set", l.Allowance, l.MaxInFlight)
		}
		return l
	}
	before := row()
	if _, err := run("-allowance", "9", "-max-in-flight", "0"); err == nil {
		t.Fatal("user set with -max-in-flight 0 succeeded")
	}
	if after := row(); *after.Allowance != *before.Allowance || *after.MaxInFlight != *before.MaxInFlight {
		t.Errorf("user set -allowance 9 -max-in-flight 0 failed but changed the user: allowance %d -> %d, max_in_flight %d -> %d",
			*before.Allowance, *after.Allowance, *before.MaxInFlight, *after.MaxInFlight)
	}
	v, err = run("-allowance", "none")
	if err != nil {
		t.Fatal(err)
	}
	if o := overrides(v); o["allowance"] != nil || o["max_in_flight"] != float64(3) {
		t.Fatalf("after dropping the allowance override: %v, want it null and max_in_flight still 3", o)
	}
}

// TestHelpFlagIsNoError: `gateway <command> -h` prints the command's flags and exits 0, as a
// help asked for is an answer, not a failure (it printed them, then "gateway: flag: help
// requested", and exited 1: a script checking a command's flags failed).
func TestHelpFlagIsNoError(t *testing.T) {
	out, err := exec.Command(gatewayBin, "report", "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("gateway report -h: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "-config") || strings.Contains(string(out), "help requested") {
		t.Errorf("gateway report -h printed:\n%s\nwant its flags, and no error", out)
	}
}
