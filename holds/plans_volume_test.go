//go:build volume

package holds_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPlansAtVolume runs every statement of the hot and periodic paths against a database of
// two months of traffic (scripts/seed-volume.sql: 10 000 users, 1.5 M runs, 600 000 ledger
// rows, 300 000 pruned sums, 200 000 sessions) and counts the rows each reads (the session's
// Handler_read_* counters): each must read what its answer needs — its users' live holds, a
// page, a batch, a day — never a table's history. It seeds for minutes, so it is not in the
// default suite; README § Tests says how to run it:
//
//	go test -tags volume -run TestPlansAtVolume -timeout 30m ./holds/
//
// MariaDB only (the seed counts with the SEQUENCE engine). Give the server a buffer pool of
// 1 GB or more, or the seed takes several times as long.
func TestPlansAtVolume(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	seedVolume(ctx, t, dsn)
	db := testenv.Open(t, dsn)
	// One connection, so that the session's handler counters see every statement measured.
	db.SetMaxOpenConns(1)
	log := zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))
	st := holds.NewStore(db, testPlans(), "standard", log)
	f := &acctFixture{t: t, db: db, store: st}
	measure := func(name string, most int64, fn func() error) {
		t.Helper()
		before := handlerReads(ctx, t, f)
		if err := fn(); err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		read := handlerReads(ctx, t, f) - before
		t.Logf("%-48s read %8d rows (at most %d)", name, read, most)
		if read > most {
			t.Errorf("%s read %d rows, want at most %d", name, read, most)
		}
	}
	const heavy, light, page = 41, 500, 50 // user-00041: 15 000 kept runs; user-00500: 150
	var userRuns int64
	if err := db.GetContext(ctx, &userRuns, "SELECT COUNT(*) FROM run_holds WHERE user_id = ?", heavy); err != nil {
		t.Fatal(err)
	}
	var today time.Time
	if err := db.GetContext(ctx, &today, "SELECT TIMESTAMP(UTC_DATE())"); err != nil {
		t.Fatal(err)
	}
	var dayRuns int64 // the kept runs of the report's day
	if err := db.GetContext(ctx, &dayRuns, "SELECT COUNT(*) FROM run_holds WHERE settled_at >= ? AND settled_at < ?",
		today.AddDate(0, 0, -2), today.AddDate(0, 0, -1)); err != nil {
		t.Fatal(err)
	}

	measure("key lookup (a live and a revoked key)", 10, func() error {
		_, err := st.UsersByKeys(ctx, []string{fmt.Sprintf("tg_volume_%d", heavy), fmt.Sprintf("tg_volume_%d", 10_000+heavy)})
		return err
	})
	measure("/v1/credits of a heavy user", 20, func() error { _, err := st.Balance(ctx, heavy); return err })
	measure("/v1/credits of a user with a live hold", 20, func() error { _, err := st.Balance(ctx, 2); return err })
	// 50 users, some with live holds: each admission reads its user, its live holds and its ledger row.
	var reqs []holds.AdmitRequest
	var sts []holds.Settlement
	for i := range 50 {
		id := fmt.Sprintf("r_volume_%02d", i)
		reqs = append(reqs, holds.AdmitRequest{RunID: id, UserID: uint64(1 + i), Model: "gpt-4o", State: holds.StateRunning, TTL: time.Minute, Fresh: true})
		sts = append(sts, holds.Settlement{RunID: id, CostMicro: 1_000, Calls: 1, Source: holds.SourceComplete})
	}
	measure("admission batch of 50 users", 20*50, func() error { _, err := st.AdmitBatch(ctx, reqs); return err })
	measure("settlement batch of 50 runs", 20*50, func() error { _, err := st.SettleBatch(ctx, sts); return err })
	measure("/v1/runs/{id}", 5, func() error { _, err := st.Run(ctx, 6, md5hex("run-5")); return err })
	// Each live state's part read in its index's order, then the two merged (a temporary table).
	measure("reconciler's scan for expired holds (200)", 5*200, func() error {
		q, args := holds.ExpiredQuery(time.Time{}, "", 200)
		var n []struct{}
		rows, err := db.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			n = append(n, struct{}{})
		}
		return rows.Err()
	})
	var in *holds.Instance
	measure("instance registration", 20, func() error {
		var err error
		in, err = st.RegisterInstance(ctx, "volume", time.Second, time.Minute, log)
		return err
	})
	measure("heartbeat", 5, func() error { return in.Beat(ctx) })
	measure("watch of the other instances' beats", 400, func() error { return in.Watch(ctx) })
	measure("sessions prune, a batch of 1000", 5*1000, func() error { _, err := st.PruneSessions(ctx, 24*time.Hour, 1000); return err })
	for _, tc := range []struct {
		name string
		f    holds.RunFilter
		most int64
	}{
		{"run listing, a page", holds.RunFilter{}, 4*page + 20},
		{"run listing, a light user's page", holds.RunFilter{UserID: light}, 200 + 4*page + 20},
		// A user's listing sorts that user's runs (README § Known limits: no index per user).
		{"run listing, a heavy user's page", holds.RunFilter{UserID: heavy}, userRuns + 4*page + 20},
		{"run listing, running", holds.RunFilter{State: holds.StateRunning}, 2000 + 4*page + 20},
		{"run listing, settled in a day", holds.RunFilter{SettledSince: today.AddDate(0, 0, -2), SettledUntil: today.AddDate(0, 0, -1)}, 4*page + 20},
		{"run listing, begun since a month", holds.RunFilter{Since: today.AddDate(0, 0, -30)}, 4*page + 20},
	} {
		tc.f.Limit = page
		measure(tc.name, tc.most, func() error { _, err := st.ListRuns(ctx, tc.f); return err })
	}
	day := today.AddDate(0, 0, -2)
	// The day's runs, grouped through temporary tables, and its ledger and pruned rows.
	measure("usage report of a day, every user", 8*dayRuns+30*10_000, func() error { _, err := st.Usage(ctx, day, day, 0); return err })
	measure("usage report of a pruned day, every user", 30*2_500, func() error {
		_, err := st.Usage(ctx, today.AddDate(0, 0, -90), today.AddDate(0, 0, -90), 0)
		return err
	})
	// A user's report reads that user's runs of its days (about 250 a day for the heavy user).
	measure("usage report of a day, a heavy user", 10*300, func() error { _, err := st.Usage(ctx, day, day, heavy); return err })
	measure("usage report of a month, a light user", 2*200+30*31, func() error {
		_, err := st.Usage(ctx, today.AddDate(0, 0, -30), today, light)
		return err
	})
	measure("user listing, a page", 2*page+20, func() error { _, err := st.ListUsers(ctx, "user-05000", page); return err })
	measure("key listing", 2*page+20, func() error { _, err := st.ListKeys(ctx, heavy, 0, page); return err })
	measure("grant listing", 2*page+20, func() error { _, err := st.Grants(ctx, heavy, 0, page); return err })
	// The instances table is sorted whole: it keeps a row per process start until a while after
	// its sweep, a few hundred rows, not the traffic.
	var instances int64
	if err := db.GetContext(ctx, &instances, "SELECT COUNT(*) FROM instances"); err != nil {
		t.Fatal(err)
	}
	measure("instance listing", instances+2*page+20, func() error { _, err := st.ListInstances(ctx, "", page); return err })
	// Prune: the runs settled 59 to 60 days ago, about 26 000, in batches of 1 000, each reading
	// its runs through the settled_at index, their rows, their users' pruned days, and deleting
	// them (about 10 reads a run).
	var res holds.PruneResult
	measure("prune of a day's runs, batches of 1000", 27*12*1_000, func() error {
		var err error
		res, err = st.PruneSettled(ctx, 59*24*time.Hour, 1_000)
		return err
	})
	t.Logf("prune: %d runs in %d batches", res.Runs, res.Batches)
	if res.Batches < int(res.Runs/1_000) {
		t.Errorf("prune of %d runs in %d batches: more than 1 000 rows a transaction", res.Runs, res.Batches)
	}
}

// md5hex is MySQL's MD5(s): the seed's run ids.
func md5hex(s string) string {
	h := md5.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

// seedVolume runs scripts/seed-volume.sql on one connection to dsn (its statements share
// session variables), opened as `gateway migrate` opens it: without the money paths' read
// timeout, which a statement writing a million rows outlasts.
func seedVolume(ctx context.Context, t *testing.T, dsn string) {
	t.Helper()
	db, err := holds.OpenForMigrate(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	body, err := os.ReadFile("../scripts/seed-volume.sql")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	for _, stmt := range strings.Split(strings.Join(lines, "\n"), ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("seed: %q: %v", stmt, err)
		}
	}
	t.Logf("seeded in %v", time.Since(start).Round(time.Second))
}
