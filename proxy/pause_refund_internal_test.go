package proxy

import (
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestPauseRefundIsTheHoldChargeLessWhatTheCallUsed: a run of one call charged its hold by
// another process (reconcile_hold) while the call's process was stopped gets back what the
// call's own settlement would not have charged: all of it for a call never forwarded, the hold
// less the call's discounted price for one forwarded, and nothing for one that used more than
// the hold, whose charge stands (the rest uncharged, never taken on top).
func TestPauseRefundIsTheHoldChargeLessWhatTheCallUsed(t *testing.T) {
	run := holds.Run{HeldMicro: 20_000, CapMicro: 500_000, ChargedMicro: 20_000}
	discounted := run
	discounted.DiscountBP = 2_500 // 25 % off
	capped := run
	capped.CapMicro = 30_000
	for _, tc := range []struct {
		name              string
		run               holds.Run
		st                holds.Settlement
		refund, uncharged int64
	}{
		{"never forwarded", run, holds.Settlement{Source: holds.SourceRelease}, 20_000, 0},
		{"duplicate", run, holds.Settlement{Source: holds.SourceDuplicate}, 20_000, 0},
		{"forwarded, failed before work", run, holds.Settlement{Source: holds.SourceUpstreamError}, 20_000, 0},
		{"forwarded, used 200", run, holds.Settlement{Source: holds.SourceComplete, CostMicro: 200}, 19_800, 0},
		{"forwarded, used 200 at a discount", discounted, holds.Settlement{Source: holds.SourceComplete, CostMicro: 200}, 19_850, 0},
		{"forwarded, used the hold", run, holds.Settlement{Source: holds.SourceComplete, CostMicro: 20_000}, 0, 0},
		{"forwarded, used more than the hold", run, holds.Settlement{Source: holds.SourceComplete, CostMicro: 25_000}, 0, 5_000},
		{"forwarded, used more than the cap", capped, holds.Settlement{Source: holds.SourceComplete, CostMicro: 90_000}, 0, 10_000},
		{"a settlement that charges the hold", run, holds.Settlement{Source: holds.SourceComplete, ChargeHeld: true}, 0, 0},
	} {
		refund, uncharged := pauseRefund(tc.run, tc.st)
		if refund != tc.refund || uncharged != tc.uncharged {
			t.Errorf("%s: refund %d, uncharged %d µUSD; want %d, %d", tc.name, refund, uncharged, tc.refund, tc.uncharged)
		}
	}
}
