package admin_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestReportDefaultDayIsTheDatabases: a usage report asked without dates covers the day the
// ledger calls today — the database's UTC day, the one charges land on — not the gateway's,
// which may be on the other side of midnight from it.
func TestReportDefaultDayIsTheDatabases(t *testing.T) {
	frozen := time.Date(2026, 3, 7, 23, 59, 59, 900_000_000, time.UTC)
	f := frozenFixture(t, frozen)

	status, body, raw := f.call("GET", "/admin/reports/usage", adminToken, nil)
	if status != http.StatusOK {
		t.Fatalf("report: %d %s", status, raw)
	}
	if body["from"] != "2026-03-07" || body["to"] != "2026-03-07" {
		t.Fatalf("report days %v..%v, want the database's day 2026-03-07 (the process's is %s)",
			body["from"], body["to"], time.Now().UTC().Format(time.DateOnly))
	}
}

// TestReportOneEndDefaultsToTheDatabasesDay: a usage report asked with one end only covers
// from that end to the database's day (or from that day to it): ?from=2026-03-01 is "since
// the 1st", not a refusal nor a report up to the year 1. Mutant: the default day read only
// when both ends are missing (|| -> &&), which answered each of these 400.
func TestReportOneEndDefaultsToTheDatabasesDay(t *testing.T) {
	frozen := time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC)
	f := frozenFixture(t, frozen)

	for _, c := range []struct{ query, from, to string }{
		{"from=2026-03-01", "2026-03-01", "2026-03-07"},
		{"to=2026-03-09", "2026-03-07", "2026-03-09"},
	} {
		status, body, raw := f.call("GET", "/admin/reports/usage?"+c.query, adminToken, nil)
		if status != http.StatusOK {
			t.Errorf("report ?%s: %d %s, want 200", c.query, status, raw)
			continue
		}
		if body["from"] != c.from || body["to"] != c.to {
			t.Errorf("report ?%s: days %v..%v, want %s..%s", c.query, body["from"], body["to"], c.from, c.to)
		}
	}
}

// frozenFixture is the admin API over a database whose every session runs at the instant at
// (the driver sends SET timestamp), so that "today" is the test's.
func frozenFixture(t *testing.T, at time.Time) *fixture {
	t.Helper()
	db := testenv.Open(t, testenv.DSNAt(t, testenv.MySQLDSN(t), at))
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	r := chi.NewRouter()
	r.Mount("/admin", admin.New(holds.NewStore(db, plans(), "standard", log), 1000, adminToken, log))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return &fixture{t: t, db: db, url: srv.URL}
}
