package holds_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// BenchmarkAdmitSettle is one call's money path against the real database: a hold and its
// settlement, sequentially, for one user. Round trips dominate; see bench/README.md.
func BenchmarkAdmitSettle(b *testing.B) {
	db := testenv.MySQL(b)
	st := holds.NewStore(db, map[string]holds.Plan{"standard": {AllowanceMicro: 1 << 50, HoldNormalMicro: 20_000,
		HoldHeavyMicro: 60_000, HeavyAfterTurns: 4, MaxInFlight: 3, MaxRunCostMicro: 500_000}}, "standard", zap.NewNop())
	ctx := context.Background()
	u, err := st.CreateUser(ctx, "bench", "standard")
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		i++
		id := "r_bench_" + strconv.Itoa(i)
		if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: id, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute, Fresh: true}); err != nil {
			b.Fatal(err)
		}
		if _, err := st.Settle(ctx, holds.Settlement{RunID: id, UserID: u.ID, CostMicro: 100, Source: holds.SourceComplete}); err != nil {
			b.Fatal(err)
		}
	}
}
