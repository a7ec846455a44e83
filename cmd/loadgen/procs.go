package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clkTck is USER_HZ, 100 on every Linux the bench runs on.
const clkTck = 100

// rssKB reads VmRSS of pid from /proc.
func rssKB(pid int) int64 { return statusKB(pid, "VmRSS:") }

// statusKB reads one kB field of /proc/pid/status.
func statusKB(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte(field)); ok {
			f := strings.Fields(string(rest))
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// cpuTicks is utime+stime of pid, every thread of it included; what its reaped children used
// (cutime, cstime) is not counted.
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// the command name may hold spaces; fields start after the last ')'
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// procWatch samples RSS of one pid and CPU of several while a scenario runs.
type procWatch struct {
	rssPid  int
	pids    map[string]int
	start   map[string]int64
	t0      time.Time
	mu      sync.Mutex
	maxRSS  int64
	hwm     bool // VmHWM was reset at the start: it is the exact peak over the watch
	stop    context.CancelFunc
	stopped chan struct{}
}

func watch(rssPid int, pids map[string]int) *procWatch {
	w := &procWatch{rssPid: rssPid, pids: pids, start: map[string]int64{}, t0: time.Now(), stopped: make(chan struct{})}
	for name, pid := range pids {
		w.start[name] = cpuTicks(pid)
	}
	// Sampling every 50 ms can miss a peak between samples; the kernel's high-water mark,
	// reset here ("5" resets VmHWM to the current RSS), cannot.
	if rssPid > 0 {
		w.hwm = os.WriteFile("/proc/"+strconv.Itoa(rssPid)+"/clear_refs", []byte("5"), 0) == nil
	}
	var ctx context.Context
	ctx, w.stop = context.WithCancel(context.Background())
	go func() {
		defer close(w.stopped)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if rssPid > 0 {
				r := rssKB(rssPid)
				w.mu.Lock()
				w.maxRSS = max(w.maxRSS, r)
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// done returns the peak RSS (MB) of rssPid and each process's CPU use in cores (CPU seconds
// per wall second) over the watch.
func (w *procWatch) done() (float64, map[string]float64) {
	w.stop()
	<-w.stopped
	if w.hwm {
		w.maxRSS = max(w.maxRSS, statusKB(w.rssPid, "VmHWM:"))
	}
	wall := time.Since(w.t0).Seconds()
	cpu := map[string]float64{}
	for name, pid := range w.pids {
		cpu[name] = round2(float64(cpuTicks(pid)-w.start[name]) / clkTck / wall)
	}
	return round2(float64(w.maxRSS) / 1024), cpu
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }
