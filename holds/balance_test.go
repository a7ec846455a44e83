package holds_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// With no allowance every charge moves from prepaid to today's ledger, so prepaid + used_today
// is what was granted whatever is settled meanwhile. A balance read while calls settle must
// never see one side of a settlement without the other (it showed the old prepaid beside the
// new ledger, and overstated what the user could spend).
func TestBalanceNeverSeesHalfASettlement(t *testing.T) {
	// used_today is one day's row: past a midnight, the old day's charges leave it while
	// prepaid keeps them, torn or not. The database's day stands still.
	f := newAcctFixtureMidday(t)
	u := f.user("torn", "standard")
	zero, inFlight := int64(0), 50
	if err := f.store.SetUserLimits(f.ctx(), u.ID, &zero, &inFlight, nil); err != nil {
		t.Fatal(err)
	}
	const granted = 100_000_000
	f.grant(u, granted, "seed")

	ctx := f.ctx()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				run := fmt.Sprintf("r_torn_%d_%d", w, i)
				if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute}); err != nil {
					t.Errorf("admit %s: %v", run, err)
					return
				}
				if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, CostMicro: 1_000, Calls: 1, Source: holds.SourceComplete}); err != nil {
					t.Errorf("settle %s: %v", run, err)
					return
				}
			}
		}()
	}
	const reads = 2000
	torn := 0
	for range reads {
		b, err := f.store.Balance(ctx, u.ID)
		if err != nil {
			t.Fatal(err)
		}
		if b.PrepaidMicro+b.UsedTodayMicro != granted {
			torn++
		}
	}
	close(stop)
	wg.Wait()
	if torn > 0 {
		t.Errorf("%d of %d balance reads saw half a settlement (prepaid + used_today != %d granted)", torn, reads, granted)
	}
}

// The balance's day is the one its used_today was read for: the database's, not the
// gateway's clock, which may be on the other side of midnight from it.
func TestBalanceDayIsTheLedgersDay(t *testing.T) {
	// Every session of this handle runs at this instant (the driver sends SET timestamp).
	frozen := time.Date(2026, 3, 7, 23, 59, 59, 900_000_000, time.UTC)
	db := testenv.Open(t, testenv.DSNAt(t, testenv.MySQLDSN(t), frozen))
	st := holds.NewStore(db, acctPlans(), "standard", zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := st.CreateUser(ctx, "dayed", "standard")
	if err != nil {
		t.Fatal(err)
	}

	b, err := st.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Day.Format(time.DateOnly); got != "2026-03-07" {
		t.Errorf("balance day = %s, want the database's 2026-03-07", got)
	}
}
