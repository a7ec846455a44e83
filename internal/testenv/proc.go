package testenv

import (
	"os/exec"
	"syscall"
)

// DiesWithTests makes cmd's process get SIGKILL when the test binary that started it dies,
// and returns cmd. A test's cleanup kills the servers it started (gateways, redis-server,
// mariadbd), but cleanups do not run when go test's -timeout panics the binary, or when it is
// killed: the servers lived on, listening, holding connections to the test services and
// reconciling a dropped database, long after the run had failed. (Linux sends the signal when
// the thread that started the process ends; the Go runtime keeps its threads while the
// process runs.)
func DiesWithTests(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return cmd
}
