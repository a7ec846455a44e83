package holds_test

import (
	"context"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The database's share of one call, next to the least a durable hold can cost on the same
// server. `make bench` runs these before its scenarios (on the same MariaDB, idle) so that
// latency-1conn's added latency can be split into what the hold transaction costs and what
// the gateway costs, and a missed target can be told apart from a slow gateway. Each reports
// p50 and p99 of its operation in microseconds besides the mean.
//
//	go test -run '^$' -bench BenchmarkDB -benchtime 2000x ./holds/

// BenchmarkDBRoundTrip is one statement that does nothing: the network and protocol floor
// of every round trip.
func BenchmarkDBRoundTrip(b *testing.B) {
	f := newBenchFixture(b)
	conn := f.conn(b)
	var lat latencies
	for b.Loop() {
		start := time.Now()
		if _, err := conn.ExecContext(context.Background(), "DO 1"); err != nil {
			b.Fatal(err)
		}
		lat.add(start)
	}
	lat.report(b)
}

// BenchmarkDBDurableHoldFloor is the least any durable hold can cost: one round trip that
// begins, locks the user's row, inserts the hold and commits — no aggregate, no ledger read,
// no decision between reads and writes.
func BenchmarkDBDurableHoldFloor(b *testing.B) {
	f := newBenchFixture(b)
	conn := f.conn(b)
	uid := f.user.ID
	var lat latencies
	i := 0
	for b.Loop() {
		i++
		start := time.Now()
		_, err := conn.ExecContext(context.Background(), `START TRANSACTION;
			SELECT id FROM users WHERE id = ? FOR UPDATE;
			INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, discount_bp, expires_at)
			VALUES (?, ?, 'settled', 0, 0, 'floor', 0, NOW(6));
			COMMIT`, uid, "r_floor_"+strconv.Itoa(i)+"_"+testenv.RandomID(4), uid)
		if err != nil {
			b.Fatal(err)
		}
		lat.add(start)
	}
	lat.report(b)
	// The rows are settled at 0 and counted nowhere; remove them so the ledger check at
	// cleanup reads only the holds the store wrote.
	if _, err := conn.ExecContext(context.Background(), "DELETE FROM run_holds WHERE user_id = ? AND model = 'floor'", uid); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkDBAdmit is one admission alone, as a caller whose previous call has settled.
func BenchmarkDBAdmit(b *testing.B) {
	f := newBenchFixture(b)
	var lat latencies
	i := 0
	for b.Loop() {
		i++
		run := f.runID(i)
		start := time.Now()
		f.writeBatch(b, nil, run)
		lat.add(start)
		b.StopTimer()
		f.writeBatch(b, &holds.Settlement{RunID: run, UserID: f.user.ID, CostMicro: 10, Source: holds.SourceComplete}, "")
		b.StartTimer()
	}
	lat.report(b)
}

// BenchmarkDBSettleAndAdmit is what a sequential caller's call costs the database: the
// previous call's settlement and this call's admission in one transaction (holds.Writer
// merges them; see WriteBatch).
func BenchmarkDBSettleAndAdmit(b *testing.B) { settleAndAdmit(b, 0) }

// BenchmarkDBSettleAndAdmitPaced is the same transaction with the pause a sequential caller
// leaves between two (its call's HTTP round trips, ~1 ms): on a machine whose idle CPUs sleep,
// every round trip after a pause pays a wake-up, and the transaction costs more than back to
// back. It is the figure to set against the gateway's admit_tx phase for a single caller.
func BenchmarkDBSettleAndAdmitPaced(b *testing.B) { settleAndAdmit(b, time.Millisecond) }

// settleAndAdmit times the previous call's settlement with the next admission, pausing
// between transactions (timer stopped).
func settleAndAdmit(b *testing.B, pause time.Duration) {
	f := newBenchFixture(b)
	var lat latencies
	prev := ""
	i := 0
	for b.Loop() {
		i++
		run := f.runID(i)
		var st *holds.Settlement
		if prev != "" {
			st = &holds.Settlement{RunID: prev, UserID: f.user.ID, CostMicro: 10, Source: holds.SourceComplete}
		}
		start := time.Now()
		f.writeBatch(b, st, run)
		lat.add(start)
		prev = run
		if pause > 0 {
			b.StopTimer()
			time.Sleep(pause)
			b.StartTimer()
		}
	}
	f.writeBatch(b, &holds.Settlement{RunID: prev, UserID: f.user.ID, CostMicro: 10, Source: holds.SourceComplete}, "")
	lat.report(b)
}

// benchFixture is a store and a user on a fresh database, checked against the ledger at the end.
type benchFixture struct{ *settleFixture }

func newBenchFixture(b *testing.B) *benchFixture { return &benchFixture{newSettleFixture(b)} }

// conn is one connection for the whole benchmark, as a batch transaction has.
func (f *benchFixture) conn(b *testing.B) *sqlx.Conn {
	c, err := f.store.DB().Connx(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func (f *benchFixture) runID(i int) string {
	return "r_bench_" + strconv.Itoa(i) + "_" + testenv.RandomID(4)
}

// writeBatch settles st (if any) and admits run (if not empty) in one batch.
func (f *benchFixture) writeBatch(b *testing.B, st *holds.Settlement, run string) {
	var sts []holds.Settlement
	if st != nil {
		sts = append(sts, *st)
	}
	var reqs []holds.AdmitRequest
	if run != "" {
		reqs = append(reqs, holds.AdmitRequest{RunID: run, UserID: f.user.ID, State: holds.StateRunning,
			TTL: time.Minute, Fresh: true, Model: "bench"})
	}
	settled, admitted, err := f.store.WriteBatch(context.Background(), sts, reqs)
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range settled {
		if s.Err != nil || !s.Applied {
			b.Fatalf("settlement: %+v", s)
		}
	}
	for _, a := range admitted {
		if a.Err != nil {
			b.Fatalf("admission: %v", a.Err)
		}
	}
}

// latencies keeps every sample of a benchmark, for percentiles.
type latencies []time.Duration

func (l *latencies) add(start time.Time) { *l = append(*l, time.Since(start)) }

// report adds p50-µs and p99-µs (nearest rank) to the benchmark's figures.
func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	b.ReportMetric(float64(l.at(0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(l.at(0.99).Microseconds()), "p99-µs")
}

// at is the nearest-rank quantile q of the samples: the ceil(q × n)-th smallest (less a hair
// before the ceiling, as in floating point q × n can land just above a whole rank).
func (l latencies) at(q float64) time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	rank := int(math.Ceil(q*float64(len(s)) - 1e-9))
	return s[max(0, min(len(s)-1, rank-1))]
}

// The benchmarks' p50 and p99 are nearest-rank: of 2000 samples the 1000th and 1980th
// smallest, not the ranks above them.
func TestLatenciesAtIsNearestRank(t *testing.T) {
	for _, n := range []int{2000, 1000, 100, 7, 1} {
		l := make(latencies, n)
		for i := range l {
			l[i] = time.Duration(n-i) * time.Microsecond // value == rank, stored in reverse
		}
		for _, p := range []float64{0.50, 0.99} {
			want := time.Duration(math.Ceil(p*float64(n)-1e-9)) * time.Microsecond
			if got := l.at(p); got != want {
				t.Errorf("n %d p%v: %v, want %v", n, p*100, got, want)
			}
		}
	}
}
