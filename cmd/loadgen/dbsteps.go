package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
)

// DBStep is one of holds' BenchmarkDB* figures: what one database step of a call costs on the
// bench's MariaDB, idle, next to the least a durable hold can cost there. It splits
// latency-1conn's added latency into the hold transaction and the rest of the gateway.
type DBStep struct {
	Name   string  `json:"name"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
}

// readDBSteps parses `go test -bench BenchmarkDB ./holds/` output: lines such as
//
//	BenchmarkDBAdmit-2   2000   1111599 ns/op   1035 p50-µs   2531 p99-µs
//
// Other lines (goos, PASS, ok) are skipped; a file with no benchmark line is an error, since
// bench.sh asked for them.
func readDBSteps(path string) ([]DBStep, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	steps, err := parseDBSteps(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return steps, nil
}

func parseDBSteps(r io.Reader) ([]DBStep, error) {
	var steps []DBStep
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "BenchmarkDB") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(fields[0], "BenchmarkDB"), "-")
		s := DBStep{Name: name}
		// After the name and the iteration count come value-unit pairs.
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: value %q: %w", fields[0], fields[i], err)
			}
			switch fields[i+1] {
			case "ns/op":
				s.MeanUS = round3(v / 1000)
			case "p50-µs":
				s.P50US = v
			case "p99-µs":
				s.P99US = v
			}
		}
		steps = append(steps, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("no BenchmarkDB lines")
	}
	return steps, nil
}

func printDBSteps(w io.Writer, steps []DBStep) {
	if len(steps) == 0 {
		return
	}
	fmt.Fprintln(w, "\n== database share of one call (go test -bench BenchmarkDB ./holds/, same MariaDB, idle) ==")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\tp50 ms\tp99 ms\tmean ms\t")
	for _, s := range steps {
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t\n", s.Name, s.P50US/1000, s.P99US/1000, s.MeanUS/1000)
	}
	tw.Flush()
	fmt.Fprintln(w, "(DurableHoldFloor: begin, lock the user, insert a hold, commit, in one round trip — the least any")
	fmt.Fprintln(w, " durable hold costs here; SettleAndAdmit: what a sequential caller's call costs the database,")
	fmt.Fprintln(w, " back to back, and Paced with the 1 ms pause between calls a single caller leaves)")
}
