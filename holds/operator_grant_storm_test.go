package holds_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestGrantDeliveriesRaceCallsRunsAndReports: payment webhooks delivered three times at once
// (top-ups and refunds, each key by three deliverers racing) while plain calls and named runs
// (calls admitted again through the batch writer and recorded on the run's row) spend, an
// operator disables and enables the users, and usage reports are read throughout. Each key
// must credit exactly once, every delivery of it answered with the same grant; every report
// read mid-storm must equal the day ledger it was read beside; and at the end nothing is held,
// the books balance (Audit), and no user is in debt past DESIGN §3's bound, Σ (charged − held).
// The plan has no allowance and no call is charged past its hold, so that bound is 0: a refund
// may take only what the calls in flight do not hold, and one that took credits a hold had
// reserved (the refund's check of the holds dropped) shows as debt once those calls settle:
// in the balance at the end, or, paid off by a later top-up, in the prepaid credits that
// top-up's row found.
func TestGrantDeliveriesRaceCallsRunsAndReports(t *testing.T) {
	db := testenv.MySQL(t)
	plans := map[string]holds.Plan{"standard": {AllowanceMicro: 0, HoldNormalMicro: 15_000, HoldHeavyMicro: 40_000,
		HeavyAfterTurns: 4, MaxInFlight: 5, MaxRunCostMicro: 80_000, DiscountBP: 1_000}}
	st := holds.NewStore(db, plans, "standard", zap.NewNop())
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	suffix := testenv.RandomID(4)
	const users, plainCallers, namedRuns, callsPerRun, keys, deliverers = 3, 3, 2, 6, 3_000, 3
	ids := standardUsers(ctx, t, st, users, "grantstorm-", suffix)
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 3, MaxBatch: 32, Linger: time.Millisecond,
		AdmitTimeout: 20 * time.Second, SettleTimeout: 20 * time.Second})
	defer w.Close()

	var mu sync.Mutex
	beyond := map[uint64]int64{} // per user, Σ (charged − held)
	charge := func(uid uint64, h holds.Hold, res holds.Settled) {
		mu.Lock()
		beyond[uid] += max(0, res.ChargedMicro-h.HeldMicro)
		mu.Unlock()
	}
	var spenders sync.WaitGroup
	var spendersLeft atomic.Int32
	spend := func(f func()) {
		spenders.Add(1)
		spendersLeft.Add(1)
		go func() {
			defer spenders.Done()
			defer spendersLeft.Add(-1)
			f()
		}()
	}
	for ui, uid := range ids {
		for c := range plainCallers {
			spend(func() {
				rng := rand.New(rand.NewPCG(uint64(ui), uint64(c)))
				for j := range 50 {
					run := "r_gs_" + suffix + "_" + strconv.Itoa(ui) + "_" + strconv.Itoa(c) + "_" + strconv.Itoa(j)
					h, err := w.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: uid, Model: "fake-gpt", State: holds.StateRunning,
						TTL: time.Minute, Fresh: true, Heavy: rng.IntN(4) == 0})
					var busy *holds.TooManyInFlightError
					switch {
					case errors.As(err, &busy), errors.Is(err, holds.ErrInsufficient), errors.Is(err, holds.ErrUserDisabled):
						continue
					case err != nil:
						t.Error(err)
						return
					}
					// Most calls use all their hold, none more: any debt is then a refund's.
					cost := pricing.MaxCostWithin(h.HeldMicro, h.DiscountBP)
					if rng.IntN(4) == 0 {
						cost = rng.Int64N(cost + 1)
					}
					res, err := w.Settle(ctx, holds.Settlement{RunID: run, UserID: uid, CostMicro: cost, Calls: 1,
						Source: holds.SourceComplete})
					if err != nil || !res.Applied {
						t.Errorf("settle %s: %+v, %v", run, res, err)
						return
					}
					charge(uid, h, res)
				}
			})
		}
		for r := range namedRuns {
			spend(func() {
				rng := rand.New(rand.NewPCG(uint64(ui), 100+uint64(r)))
				for k := 0; k < 4; k++ {
					run := "x_gs_" + suffix + "_" + strconv.Itoa(ui) + "_" + strconv.Itoa(r) + "_" + strconv.Itoa(k)
					req := holds.AdmitRequest{RunID: run, UserID: uid, ClientRunID: "agent-" + strconv.Itoa(r) + "-" + strconv.Itoa(k),
						Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute}
					var first holds.Hold
					var used int64 // list cost its calls recorded
				calls:
					for call := range callsPerRun {
						h, err := w.Admit(ctx, req)
						var busy *holds.TooManyInFlightError
						switch {
						case errors.As(err, &busy), errors.Is(err, holds.ErrInsufficient), errors.Is(err, holds.ErrUserDisabled):
							if call == 0 {
								break calls
							}
							continue
						case err != nil:
							t.Error(err)
							return
						}
						if call == 0 {
							first = h
						}
						// The run's budget: its calls stop at its hold (the proxy's reservation stops
						// them at its cap).
						budget := pricing.MaxCostWithin(first.HeldMicro, first.DiscountBP) - used
						if budget <= 0 {
							break calls
						}
						cost := min(budget, 1_000+rng.Int64N(8_000))
						if ok, err := st.RecordRunCall(ctx, run, token.New(), time.Minute, pricing.Usage{Input: 10, Output: 10}, cost, 1, false); err != nil || !ok {
							t.Errorf("record a call of %s: %v, %v", run, ok, err)
							return
						}
						used += cost
					}
					if first.RunID == "" {
						continue
					}
					res, err := w.Settle(ctx, holds.Settlement{RunID: run, UserID: uid, CostMicro: used, Calls: callsPerRun,
						Source: holds.SourceClient})
					if err != nil || !res.Applied {
						t.Errorf("settle %s: %+v, %v", run, res, err)
						return
					}
					charge(uid, first, res)
				}
			})
		}
	}

	// The webhooks, while the calls spend: each key is delivered by every deliverer, in the
	// same order, so that deliveries of one key race; a third of them are refunds.
	type answer struct {
		delivered bool
		grantID   uint64
		created   bool
		refused   bool
	}
	answers := make([][]answer, keys)
	for i := range answers {
		answers[i] = make([]answer, deliverers)
	}
	req := func(k int) holds.GrantRequest {
		amount := int64(20_000 + 1_000*(k%7))
		if k%3 == 2 {
			amount = -amount / 2
		}
		return holds.GrantRequest{UserID: ids[(k/3)%users], AmountMicro: amount, IdempotencyKey: "evt-" + suffix + "-" + strconv.Itoa(k)}
	}
	var ops sync.WaitGroup
	for d := range deliverers {
		ops.Go(func() {
			for k := 0; k < keys && spendersLeft.Load() > 0; k++ {
				g, created, err := st.Grant(ctx, req(k))
				switch {
				case errors.Is(err, holds.ErrGrantBelowZero):
					answers[k][d] = answer{delivered: true, refused: true}
				case err != nil:
					t.Errorf("deliver %d: %v", k, err)
					return
				default:
					answers[k][d] = answer{delivered: true, grantID: g.ID, created: created}
				}
			}
		})
	}
	ops.Go(func() {
		for n := 0; spendersLeft.Load() > 0; n++ {
			uid := ids[n%users]
			if _, err := st.DisableUser(ctx, uid); err != nil {
				t.Errorf("disable: %v", err)
			}
			if _, err := st.EnableUser(ctx, uid); err != nil {
				t.Errorf("enable: %v", err)
			}
		}
	})
	var reports atomic.Int32
	ops.Go(func() {
		for n := 0; spendersLeft.Load() > 0; n++ {
			today, err := st.Today(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			var uid uint64
			if n%2 == 1 {
				uid = ids[n%users]
			}
			rep, err := st.Usage(ctx, today, today, uid)
			if err != nil {
				t.Error(err)
				return
			}
			reports.Add(1)
			if rep.LedgerMicro != rep.Totals.ChargedMicro || rep.LedgerRuns != rep.Totals.ChargedRuns {
				t.Errorf("report of user %d mid-storm: charged %d in %d runs, ledger %d in %d", uid, rep.Totals.ChargedMicro,
					rep.Totals.ChargedRuns, rep.LedgerMicro, rep.LedgerRuns)
			}
		}
	})
	spenders.Wait()
	ops.Wait()
	if t.Failed() {
		return
	}

	// Each key: one grant row, answered to every delivery that was not refused, created by one.
	for k := range keys {
		var rows []holds.Grant
		if err := db.SelectContext(ctx, &rows, "SELECT id, user_id, amount_micro, balance_after_micro, idempotency_key, reason, created_at, attempt_token FROM grants WHERE idempotency_key = ?",
			req(k).IdempotencyKey); err != nil {
			t.Fatal(err)
		}
		delivered, created, refused := 0, 0, 0
		for _, a := range answers[k] {
			if a.delivered {
				delivered++
			}
			switch {
			case !a.delivered:
			case a.refused:
				refused++
			case len(rows) != 1 || a.grantID != rows[0].ID:
				t.Errorf("key %d: delivery answered grant %d, rows %+v", k, a.grantID, rows)
			case a.created:
				created++
			}
		}
		if len(rows) > 1 || (len(rows) == 1 && created != 1) || (len(rows) == 0 && refused != delivered) {
			t.Errorf("key %d: %d rows, %d of %d deliveries created it, %d refused", k, len(rows), created, delivered, refused)
		}
	}
	refunds, refused := 0, 0
	for k := range keys {
		if req(k).AmountMicro > 0 || !answers[k][0].delivered {
			continue
		}
		if answers[k][0].refused {
			refused++
		} else {
			refunds++
		}
	}
	var debt int64
	for _, b := range beyond {
		debt += b
	}
	t.Logf("%d reports read mid-storm; %d refunds granted, %d refused; calls charged %d past their holds", reports.Load(), refunds, refused, debt)
	if reports.Load() == 0 || refunds == 0 {
		t.Errorf("the storm did not race: %d reports, %d refunds granted", reports.Load(), refunds)
	}
	for _, uid := range ids {
		b, err := st.Balance(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		if b.HeldMicro != 0 || b.InFlight != 0 {
			t.Errorf("user %d: holds left behind: %+v", uid, b)
		}
		if b.PrepaidMicro < -beyond[uid] {
			t.Errorf("user %d: prepaid %d, below the overdraft bound -%d", uid, b.PrepaidMicro, beyond[uid])
		}
		// Top-ups follow the refunds and pay a debt off before the end: each grant's row
		// shows the prepaid credits it found, which must not have been past the bound either.
		var least int64
		if err := db.GetContext(ctx, &least, "SELECT COALESCE(MIN(balance_after_micro - amount_micro), 0) FROM grants WHERE user_id = ?", uid); err != nil {
			t.Fatal(err)
		}
		if least < -beyond[uid] {
			t.Errorf("user %d: a grant found prepaid %d, below the overdraft bound -%d", uid, least, beyond[uid])
		}
	}
}
