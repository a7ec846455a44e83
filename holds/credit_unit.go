package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// CreditUnit is the credit_micro the fleet serves at, as the gateway that set it recorded it
// (table credit_unit, one row). Credits are a setting — micro-USD per credit — while every
// figure in the database is micro-USD: a process that converts credits (an operator's grant,
// allowance, balance or report; a serving gateway's plans and admin API) must do it at the
// fleet's value, or it credits and shows amounts off by the ratio of the two, with nothing to
// tell. The record is what a command compares its own config's value with.
//
// Only `gateway serve` writes it: its config is by definition the fleet's, where an
// operator's command, or `gateway migrate`, often runs with none (the default 1000). A serve
// whose value differs from the record is refused unless told the change is meant
// (RecordCreditUnit's change), so that one gateway started with a stale config cannot serve at
// another value beside the fleet, nor silently move the record under the operator's commands.
type CreditUnit struct {
	CreditMicro int64     `db:"credit_micro"`
	SetBy       string    `db:"set_by"` // the instance name of the gateway that recorded it
	SetAt       time.Time `db:"set_at"`
}

// ErrNoCreditUnit is a database no gateway of this version has served yet: nothing says what a
// credit is worth there.
var ErrNoCreditUnit = errors.New("no credit_micro is recorded in the database: no gateway of this version has served it yet")

// CreditUnitMismatchError is a config whose credit_micro is not the one recorded.
type CreditUnitMismatchError struct {
	Recorded CreditUnit
	Config   int64 // the credit_micro of the config compared
}

func (e *CreditUnitMismatchError) Error() string {
	return fmt.Sprintf("this config's credit_micro is %d but the fleet serves at credit_micro %d (recorded by gateway %s at %s)",
		e.Config, e.Recorded.CreditMicro, e.Recorded.SetBy, e.Recorded.SetAt.UTC().Format(time.RFC3339))
}

// CreditUnit reads the recorded unit, ErrNoCreditUnit if there is none.
func (s *Store) CreditUnit(ctx context.Context) (CreditUnit, error) {
	var u CreditUnit
	err := s.withRetry(ctx, "read credit unit", func() error {
		return s.db.GetContext(ctx, &u, "SELECT credit_micro, set_by, set_at FROM credit_unit WHERE id = 1")
	})
	if errors.Is(err, sql.ErrNoRows) {
		return CreditUnit{}, ErrNoCreditUnit
	}
	if err != nil {
		return CreditUnit{}, fmt.Errorf("read the recorded credit_micro: %w", err)
	}
	return u, nil
}

// CheckCreditUnit refuses creditMicro unless it is the recorded one: ErrNoCreditUnit, or a
// *CreditUnitMismatchError.
func (s *Store) CheckCreditUnit(ctx context.Context, creditMicro int64) error {
	u, err := s.CreditUnit(ctx)
	if err != nil {
		return err
	}
	if u.CreditMicro != creditMicro {
		return &CreditUnitMismatchError{Recorded: u, Config: creditMicro}
	}
	return nil
}

// RecordCreditUnit records creditMicro, set by the instance named by, as the fleet's when
// none is recorded, and returns what was recorded before (found false if nothing). When
// another value is recorded it answers a *CreditUnitMismatchError and changes nothing, unless
// change is set: then it records creditMicro in its place. Two starts at once record one value,
// and the other is compared with it.
func (s *Store) RecordCreditUnit(ctx context.Context, creditMicro int64, by string, change bool) (prev CreditUnit, found bool, err error) {
	err = s.inTx(ctx, "record credit unit", func(tx *sqlx.Tx) error {
		prev, found = CreditUnit{}, false
		// The row is created if missing, then read under its lock: a SELECT … FOR UPDATE of a
		// missing row locks nothing at READ COMMITTED, and two first starts would both insert.
		res, err := tx.ExecContext(ctx, `INSERT INTO credit_unit (id, credit_micro, set_by) VALUES (1, ?, ?)
			ON DUPLICATE KEY UPDATE id = id`, creditMicro, by)
		if err != nil {
			return fmt.Errorf("record credit_micro: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("record credit_micro: %w", err)
		} else if n == 1 {
			return nil // recorded now: there was none
		}
		var cur CreditUnit
		if err := tx.GetContext(ctx, &cur, "SELECT credit_micro, set_by, set_at FROM credit_unit WHERE id = 1 FOR UPDATE"); err != nil {
			return fmt.Errorf("read the recorded credit_micro: %w", err)
		}
		prev, found = cur, true
		if cur.CreditMicro == creditMicro {
			return nil
		}
		if !change {
			return &CreditUnitMismatchError{Recorded: cur, Config: creditMicro}
		}
		if _, err := tx.ExecContext(ctx, "UPDATE credit_unit SET credit_micro = ?, set_by = ?, set_at = NOW(6) WHERE id = 1",
			creditMicro, by); err != nil {
			return fmt.Errorf("change the recorded credit_micro: %w", err)
		}
		return nil
	})
	return prev, found, err
}
