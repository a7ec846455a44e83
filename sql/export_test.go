package sql

import (
	"context"
	"database/sql"
)

// LockName is the migration lock's name expression, for tests that hold it.
const LockName = lockName

// MigrateTo applies the migrations up to version upTo.
func MigrateTo(ctx context.Context, db *sql.DB, upTo int) ([]string, error) {
	return migrateTo(ctx, db, upTo, DefaultLockWait)
}

// SplitStatements cuts a migration into its statements.
var SplitStatements = splitStatements

// AlreadyApplied reports whether stmt's error is taken for the statement's work done before.
var AlreadyApplied = alreadyApplied
