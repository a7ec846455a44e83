package admin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestUsageReportHoldsItsSlotWhileBuilt: a report keeps its slot (maxReportsAtOnce) for as
// long as it is built, and gives it back once answered: the bound is on reports being built,
// not on reports starting. Here the report's read waits behind a table lock of the test's own;
// once the database shows it waiting, its slot is taken. Mutant: the slot given back at once.
func TestUsageReportHoldsItsSlotWhileBuilt(t *testing.T) {
	db := testenv.MySQL(t)
	st := holds.NewStore(db, map[string]holds.Plan{"standard": {AllowanceMicro: 1, HoldNormalMicro: 1, HoldHeavyMicro: 1,
		HeavyAfterTurns: 1, MaxInFlight: 1, MaxRunCostMicro: 1}}, "standard", zap.NewNop())
	h := &handler{store: st, views: Views{CreditMicro: 1000}, log: zap.NewNop(), reports: make(chan struct{}, maxReportsAtOnce)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lock, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "LOCK TABLES usage_days WRITE, run_holds WRITE, pruned_runs WRITE, users WRITE"); err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.usageReport(w, httptest.NewRequest(http.MethodGet, "/reports/usage?from=2026-01-01&to=2026-01-31", nil).WithContext(ctx))
	}()
	for waiting := 0; waiting == 0; {
		if err := db.GetContext(ctx, &waiting, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND STATE LIKE 'Waiting for table%'`); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
			t.Fatalf("the report was answered while its tables were locked: %d %s", w.Code, w.Body)
		case <-ctx.Done():
			t.Fatal("the report's read never waited on the lock")
		default:
		}
	}
	if n := len(h.reports); n != 1 {
		t.Errorf("slots taken while a report is built: %d, want 1", n)
	}
	if _, err := lock.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
		t.Fatal(err)
	}
	<-done
	if w.Code != http.StatusOK {
		t.Fatalf("report: %d %s", w.Code, w.Body)
	}
	if n := len(h.reports); n != 0 {
		t.Errorf("slots taken once the report is answered: %d, want 0", n)
	}
}
