package main

import (
	"strings"
	"testing"
)

func TestParseDBSteps(t *testing.T) {
	out := `goos: linux
pkg: github.com/tollgate/tollgate/holds
BenchmarkDBRoundTrip-2          	    2000	     68293 ns/op	        67.00 p50-µs	       220.0 p99-µs
BenchmarkDBSettleAndAdmit-2     	    2000	   1381899 ns/op	      1301 p50-µs	      2880 p99-µs
PASS
ok  	github.com/tollgate/tollgate/holds	8.721s
`
	steps, err := parseDBSteps(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []DBStep{{"RoundTrip", 68.293, 67, 220}, {"SettleAndAdmit", 1381.899, 1301, 2880}}
	if len(steps) != len(want) {
		t.Fatalf("got %+v, want %+v", steps, want)
	}
	for i := range want {
		if steps[i] != want[i] {
			t.Errorf("step %d: got %+v, want %+v", i, steps[i], want[i])
		}
	}
	if _, err := parseDBSteps(strings.NewReader("FAIL\n")); err == nil {
		t.Error("output without benchmark lines parsed without error")
	}
}
