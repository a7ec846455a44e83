package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// State is a hold's lifecycle state.
type State string

const (
	StateQueued  State = "queued"  // admitted, nothing forwarded yet (a run opened before its first call)
	StateRunning State = "running" // a call was forwarded
	StateSettled State = "settled" // final; the row stays forever so a second settlement is a no-op
)

// AdmitRequest asks for a hold.
type AdmitRequest struct {
	RunID       string
	UserID      uint64
	ClientRunID string // the caller's X-Run-Id, if any
	SessionID   string
	Model       string
	Heavy       bool          // the conversation has enough user turns for the heavy tier
	State       State         // queued or running
	TTL         time.Duration // hold_ttl for a one-call run, run_ttl for an X-Run-Id run
	// Fresh promises the run id was just generated at random, so it cannot exist yet: the
	// lookup of an earlier admission is skipped (the primary key still guards).
	Fresh bool
}

// Hold is an admitted hold.
type Hold struct {
	RunID      string
	UserID     uint64
	State      State
	HeldMicro  int64
	CapMicro   int64
	DiscountBP int
	// Existing is set when the run had been admitted before (a retry, a redelivery, a later call
	// of an agent run): no second hold was taken.
	Existing bool
}

// Admit takes a hold in one short transaction: lock the user's row, one aggregate over the
// user's live holds, refuse or insert. The lock is what makes a burst of concurrent requests
// from one user see each other's holds: the twentieth request waits for the nineteenth to
// commit and then counts its hold.
func (s *Store) Admit(ctx context.Context, req AdmitRequest) (Hold, error) {
	if req.State != StateQueued && req.State != StateRunning {
		panic(fmt.Sprintf("holds: admit in state %q", req.State))
	}
	if req.TTL <= 0 {
		panic("holds: admit without a TTL")
	}
	var hold Hold
	err := s.inTx(ctx, "admit "+req.RunID, func(tx *sqlx.Tx) error {
		var err error
		hold, err = s.admitTx(ctx, tx, req)
		return err
	})
	if err != nil {
		return Hold{}, fmt.Errorf("admit %s: %w", req.RunID, err)
	}
	return hold, nil
}

func (s *Store) admitTx(ctx context.Context, tx *sqlx.Tx, req AdmitRequest) (Hold, error) {
	u, err := lockUser(ctx, tx, req.UserID)
	if err != nil {
		return Hold{}, err
	}
	if u.DisabledAt.Valid {
		return Hold{}, ErrUserDisabled
	}
	// The same run admitted again: answer with the hold it already has. Checked under the user
	// lock, so two admissions of one run cannot both miss it.
	if req.Fresh {
		// nothing to look up
	} else if existing, err := getHold(ctx, tx, req.RunID, false); err == nil {
		if existing.UserID != req.UserID {
			return Hold{}, ErrRunNotFound
		}
		if existing.State == StateSettled {
			return Hold{}, ErrRunSettled
		}
		return Hold{RunID: existing.RunID, UserID: existing.UserID, State: existing.State,
			HeldMicro: existing.HeldMicro, CapMicro: existing.CapMicro, DiscountBP: existing.DiscountBP, Existing: true}, nil
	} else if !errors.Is(err, ErrRunNotFound) {
		return Hold{}, err
	}

	plan := s.plan(u)
	var live struct {
		InFlight   int           `db:"in_flight"`
		Held       int64         `db:"held"`
		UsedToday  int64         `db:"used_today"`
		OldestLeft sql.NullInt64 `db:"oldest_left_us"`
	}
	err = tx.GetContext(ctx, &live, `
		SELECT COUNT(*) AS in_flight,
		       COALESCE(SUM(held_micro), 0) AS held,
		       COALESCE((SELECT used_micro FROM usage_days WHERE user_id = ? AND day = UTC_DATE()), 0) AS used_today,
		       MIN(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at)) AS oldest_left_us
		FROM run_holds
		WHERE user_id = ? AND state IN ('queued', 'running') AND expires_at > NOW(6)`, req.UserID, req.UserID)
	if err != nil {
		return Hold{}, fmt.Errorf("aggregate live holds: %w", err)
	}
	if live.InFlight >= plan.MaxInFlight {
		return Hold{}, &TooManyInFlightError{InFlight: live.InFlight, Limit: plan.MaxInFlight,
			RetryAfter: retryAfter(live.OldestLeft)}
	}
	available := Available(plan.AllowanceMicro, live.UsedToday, u.PrepaidMicro, live.Held)
	if available <= 0 {
		return Hold{}, ErrInsufficient
	}
	tier := plan.HoldNormalMicro
	if req.Heavy {
		tier = plan.HoldHeavyMicro
	}
	hold := Hold{RunID: req.RunID, UserID: req.UserID, State: req.State,
		HeldMicro: min(tier, available), CapMicro: min(plan.MaxRunCostMicro, available), DiscountBP: plan.DiscountBP}
	_, err = tx.ExecContext(ctx, `
		INSERT INTO run_holds (run_id, user_id, client_run_id, session_id, state, held_micro, cap_micro, model, discount_bp, expires_at)
		VALUES (?, ?, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?, ?, ?, NOW(6) + INTERVAL ? MICROSECOND)`,
		hold.RunID, hold.UserID, req.ClientRunID, req.SessionID, hold.State, hold.HeldMicro, hold.CapMicro, req.Model,
		hold.DiscountBP, req.TTL.Microseconds())
	if isDuplicate(err) {
		// Unreachable while every admission of a run locks its user first; kept as the last
		// line of defence that makes a second hold for one run impossible.
		return Hold{}, fmt.Errorf("insert hold: run admitted concurrently: %w", err)
	}
	if err != nil {
		return Hold{}, fmt.Errorf("insert hold: %w", err)
	}
	return hold, nil
}

// Available is what a user may still spend: the rest of today's allowance, plus prepaid
// credits (negative when in debt), minus what live holds reserve.
func Available(allowance, usedToday, prepaid, held int64) int64 {
	return max(0, allowance-usedToday) + prepaid - held
}

// retryAfter tells a refused caller when to come back: a slot frees when a call finishes,
// usually within seconds, and at the latest when the oldest hold expires.
func retryAfter(oldestLeftUS sql.NullInt64) time.Duration {
	const floor, ceiling = time.Second, 30 * time.Second
	if !oldestLeftUS.Valid {
		return floor
	}
	return max(floor, min(ceiling, time.Duration(oldestLeftUS.Int64)*time.Microsecond))
}
