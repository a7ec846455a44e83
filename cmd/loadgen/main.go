// Command loadgen is tollgate's load generator for `make bench` (scripts/bench.sh).
//
//	loadgen setup -dsn DSN -out keys.json   create the bench users and keys (holds.Store, MySQL)
//	loadgen run   -keys keys.json -direct URL -plain URL -gateway URL -dsn DSN [-out FILE]
//	loadgen compare -base a1.json,a2.json -head b1.json,b2.json   A/B runs, pair by pair
//
// `run` plays every scenario against the three targets in alternation (direct -> plain ->
// tollgate, for -rounds rounds), with exact percentiles (every sample kept and sorted), time to
// first byte of streams, an event order/loss check of every stream, RSS and CPU sampling of
// the processes named in -pids, and after each tollgate scenario the ledger check (day ledger
// == sum of settled charges, once no hold is left running). It prints a table and writes JSON.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loadgen setup|run|compare [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "setup":
		err = setupCmd(os.Args[2:])
	case "run":
		err = runCmd(os.Args[2:])
	case "compare":
		err = compareCmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}
