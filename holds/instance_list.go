package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// InstanceRow is one row of `instances`, as operators read it.
type InstanceRow struct {
	ID        string       `db:"id"`
	Name      string       `db:"name"`
	StartedAt time.Time    `db:"started_at"`
	BeatAt    time.Time    `db:"beat_at"`
	DeadAt    sql.NullTime `db:"dead_at"`
	Retired   bool         `db:"retired"`
	SweptAt   sql.NullTime `db:"swept_at"`
	// Silent: alive by its row, but its beat is older than its bound by the database clock —
	// the next pass of a process beating without a gap, which has watched that beat stand
	// still, declares it dead.
	Silent bool `db:"silent"`
}

// Instance states, as InstanceRow.State names them.
const (
	InstanceAlive   = "alive"
	InstanceSilent  = "silent"
	InstanceDead    = "dead"
	InstanceRetired = "retired"
)

// State is the row's state: alive, silent (its beat overdue), dead (declared by a
// reconciler) or retired (its own graceful shutdown).
func (r InstanceRow) State() string {
	switch {
	case r.DeadAt.Valid && r.Retired:
		return InstanceRetired
	case r.DeadAt.Valid:
		return InstanceDead
	case r.Silent:
		return InstanceSilent
	}
	return InstanceAlive
}

// ListInstances lists the instance rows, newest start first (id breaks ties: the order is
// total), after the row whose id is after ("" from the newest), at most limit: a page of the
// admin API's listing. An after that names no row (pruned a day after its sweep, or never
// one) is ErrBadAfter; a limit outside 1-maxListRows is ErrBadFilter, as every listing's is
// (it came from an operator's -limit or query, and panicked here).
func (s *Store) ListInstances(ctx context.Context, after string, limit int) ([]InstanceRow, error) {
	if limit <= 0 || limit > maxListRows {
		return nil, fmt.Errorf("list instances: %w: limit %d out of range 1-%d", ErrBadFilter, limit, maxListRows)
	}
	const cols = `SELECT id, name, started_at, beat_at, dead_at, retired, swept_at,
		dead_at IS NULL AND beat_at < NOW(6) - INTERVAL dead_after_us MICROSECOND AS silent FROM instances`
	var out []InstanceRow
	if after == "" {
		if err := s.db.SelectContext(ctx, &out, cols+" ORDER BY started_at DESC, id DESC LIMIT ?", limit); err != nil {
			return nil, fmt.Errorf("list instances: %w", err)
		}
		return out, nil
	}
	var at time.Time
	if err := s.db.GetContext(ctx, &at, "SELECT started_at FROM instances WHERE id = ?", after); errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("list instances after %q: %w", after, ErrBadAfter)
	} else if err != nil {
		return nil, fmt.Errorf("list instances after %s: %w", after, err)
	}
	if err := s.db.SelectContext(ctx, &out, cols+` WHERE started_at < ? OR (started_at = ? AND id < ?)
		ORDER BY started_at DESC, id DESC LIMIT ?`, at, at, after, limit); err != nil {
		return nil, fmt.Errorf("list instances after %s: %w", after, err)
	}
	return out, nil
}
