package holds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// TestFullBatchOfTheLongestItemsFitsAMegabytePacket: a batch of MaxBatch items, half
// settlements and half admissions, each with every text at its longest and most escaped (a
// model name of MaxModelLen backslashes and '<', whose price snapshot JSON escapes it again),
// is one closing script: it must fit a statement the server takes. Through a DSN whose packet
// is 1 MiB (a statement past it is sent prepared, which a script of several statements cannot
// be: 1064), the batch commits. (Measured: it fails at 256 KiB and commits at 512 KiB, far below
// the 16 MiB a MariaDB server takes by default and the driver's own 64 MiB.)
func TestFullBatchOfTheLongestItemsFitsAMegabytePacket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxAllowedPacket = 1 << 20
	db := testenv.Open(t, cfg.FormatDSN())
	plans := map[string]holds.Plan{"wide": {AllowanceMicro: 1_000_000_000, HoldNormalMicro: 1_000, HoldHeavyMicro: 1_000,
		HeavyAfterTurns: 4, MaxInFlight: holds.MaxBatch, MaxRunCostMicro: 1_000_000}}
	st := holds.NewStore(db, plans, "wide", zap.NewNop())
	u, err := st.CreateUser(ctx, "packet-"+testenv.RandomID(3), "wide")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	model := strings.Repeat(`\<`, holds.MaxModelLen/2)
	snapshot := pricing.Price{Input: 1, Output: 2, CacheRead: 3, CacheWrite: 4, CacheWrite1h: 5, AudioInput: 6, AudioOutput: 7,
		LongAbove: 1, Long: &pricing.Price{Input: 1, Output: 2, CacheRead: 3, CacheWrite: 4, CacheWrite1h: 5, AudioInput: 6, AudioOutput: 7}}.Snapshot(model)
	half := holds.MaxBatch / 2
	reqs := func(prefix string) []holds.AdmitRequest {
		out := make([]holds.AdmitRequest, half)
		for i := range out {
			out[i] = holds.AdmitRequest{RunID: fmt.Sprintf("%s_%03d_%s", prefix, i, testenv.RandomID(8)), UserID: u.ID,
				ClientRunID: strings.Repeat("c", 48) + fmt.Sprintf("%016d", i), SessionID: strings.Repeat("s", 64), Model: model,
				State: holds.StateRunning, TTL: time.Minute, Token: testenv.RandomID(16), PriceSnapshot: snapshot,
				ServedBy: testenv.RandomID(16)}
		}
		return out
	}
	first := reqs("r_pk_old")
	if _, err := st.AdmitBatch(ctx, first); err != nil {
		t.Fatal(err)
	}
	sts := make([]holds.Settlement, half)
	for i, r := range first {
		sts[i] = holds.Settlement{RunID: r.RunID, UserID: u.ID, CostMicro: 1_000 + int64(i),
			Usage: pricing.Usage{Input: 1 << 40, CacheRead: 1 << 40, CacheWrite: 1 << 40, Output: 1 << 40, CacheWrite1h: 1 << 40,
				AudioInput: 1 << 40, AudioOutput: 1 << 40},
			Calls: 1 << 20, Model: model, Source: holds.SourceUpstreamTimeout, PriceSnapshot: snapshot, Estimated: true}
	}
	second := reqs("r_pk_new")
	settled, admitted, err := st.WriteBatch(ctx, sts, second)
	if err != nil {
		t.Fatalf("batch of %d settlements and %d admissions of the longest items: %v", len(sts), len(second), err)
	}
	for i, r := range settled {
		if r.Err != nil || !r.Applied {
			t.Fatalf("settlement %d: %+v", i, r)
		}
	}
	for i, r := range admitted {
		if r.Err != nil {
			t.Fatalf("admission %d: %v", i, r.Err)
		}
		if _, err := st.Settle(ctx, holds.Settlement{RunID: r.Hold.RunID, Source: holds.SourceRelease}); err != nil {
			t.Fatal(err)
		}
	}
}
