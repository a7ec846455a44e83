package proxy

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
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

// TestSoonestChargedByPeerIsTheDeadInstanceSweepUnderTheDefaults: a plain call's hold may be
// charged by another process at its expiry or once its process is declared dead, whose last
// beat may be a beat gap older than the hold: 65 s after its arrival under the defaults
// (dead_instance_after 90 s less 2 × 10 s + the beat's timeout), not 90, nor hold_ttl's 900.
// Read as later, a call paused from 65 to 90 s was refused 503 for a hold a dead process's sweep
// had charged, and its retry paid again. A named run's hold is charged at run_ttl alone.
// Mutants: no beat gap (90 s); max for min (900 s); the named run's bound for a plain call's.
func TestSoonestChargedByPeerIsTheDeadInstanceSweepUnderTheDefaults(t *testing.T) {
	s := &Server{cfg: config.Default()}
	if got := s.soonestChargedByPeer(false); got != 65*time.Second {
		t.Errorf("plain call: %v, want 65s", got)
	}
	if got := s.soonestChargedByPeer(true); got != s.cfg.Holds.RunTTL {
		t.Errorf("named run's call: %v, want run_ttl %v", got, s.cfg.Holds.RunTTL)
	}
	s.cfg.Holds.HoldTTL = 30 * time.Second
	if got := s.soonestChargedByPeer(false); got != 30*time.Second {
		t.Errorf("plain call, hold_ttl 30s: %v, want 30s", got)
	}
}
