package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// fleetRecord is a table of one row (id 1) in which `gateway serve` records a setting every
// process of the fleet must use alike (credit_unit, plan_terms, redis_prefix), or the longest
// value any of them served with (longest_tally_ttl, longest_replay_ttl), with the instance that
// set it and when: what an operator's command, run with a config of its own, is compared with.
type fleetRecord struct {
	table  string
	column string // the setting's column
}

// recorded is a fleetRecord's row.
type recorded[T any] struct {
	Value T         `db:"value"`
	SetBy string    `db:"set_by"`
	SetAt time.Time `db:"set_at"`
}

func (r fleetRecord) query() string {
	return fmt.Sprintf("SELECT %s AS value, set_by, set_at FROM %s WHERE id = 1", r.column, r.table)
}

// readRecord reads r's row; found is false when nothing is recorded.
func readRecord[T any](ctx context.Context, s *Store, r fleetRecord) (rec recorded[T], found bool, err error) {
	err = s.withRetry(ctx, "read "+r.table, func() error { return s.db.GetContext(ctx, &rec, r.query()) })
	if errors.Is(err, sql.ErrNoRows) {
		return recorded[T]{}, false, nil
	}
	if err != nil {
		return recorded[T]{}, false, fmt.Errorf("read the recorded %s: %w", r.column, err)
	}
	return rec, true, nil
}

// writeRecord records v, set by the instance named by, when nothing is recorded, and returns
// what was recorded before (found false if nothing). Otherwise replace, given the recorded row
// under its lock, decides: true records v in its place, false keeps it, an error is returned
// and changes nothing. Two first starts at once record one value, and the other is compared
// with it.
func writeRecord[T any](ctx context.Context, s *Store, r fleetRecord, v T, by string,
	replace func(cur recorded[T]) (bool, error)) (prev recorded[T], found bool, err error) {
	err = s.inTx(ctx, "record "+r.table, func(tx *sqlx.Tx) error {
		prev, found = recorded[T]{}, false
		// The row is created if missing, then read under its lock: a SELECT … FOR UPDATE of a
		// missing row locks nothing at READ COMMITTED, and two first starts would both insert.
		res, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (id, %s, set_by) VALUES (1, ?, ?) ON DUPLICATE KEY UPDATE id = id",
			r.table, r.column), v, by)
		if err != nil {
			return fmt.Errorf("record %s: %w", r.column, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("record %s: %w", r.column, err)
		} else if n == 1 {
			return nil // recorded now: there was none
		}
		var cur recorded[T]
		if err := tx.GetContext(ctx, &cur, r.query()+" FOR UPDATE"); err != nil {
			return fmt.Errorf("read the recorded %s: %w", r.column, err)
		}
		prev, found = cur, true
		if ok, err := replace(cur); err != nil || !ok {
			return err
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET %s = ?, set_by = ?, set_at = NOW(6) WHERE id = 1", r.table, r.column),
			v, by); err != nil {
			return fmt.Errorf("change the recorded %s: %w", r.column, err)
		}
		return nil
	})
	return prev, found, err
}
