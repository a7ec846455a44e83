package holds

import (
	"context"
	"errors"
	"fmt"
	"time"
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

// creditUnitRecord is where serve records the fleet's credit_micro.
var creditUnitRecord = fleetRecord{table: "credit_unit", column: "credit_micro"}

func creditUnitOf(r recorded[int64]) CreditUnit {
	return CreditUnit{CreditMicro: r.Value, SetBy: r.SetBy, SetAt: r.SetAt}
}

// CreditUnit reads the recorded unit, ErrNoCreditUnit if there is none.
func (s *Store) CreditUnit(ctx context.Context) (CreditUnit, error) {
	rec, found, err := readRecord[int64](ctx, s, creditUnitRecord)
	if err != nil {
		return CreditUnit{}, err
	}
	if !found {
		return CreditUnit{}, ErrNoCreditUnit
	}
	return creditUnitOf(rec), nil
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
	rec, found, err := writeRecord(ctx, s, creditUnitRecord, creditMicro, by, func(cur recorded[int64]) (bool, error) {
		if cur.Value == creditMicro {
			return false, nil
		}
		if !change {
			return false, &CreditUnitMismatchError{Recorded: creditUnitOf(cur), Config: creditMicro}
		}
		return true, nil
	})
	if !found {
		return CreditUnit{}, false, err
	}
	return creditUnitOf(rec), true, err
}
