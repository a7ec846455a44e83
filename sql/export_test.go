package sql

// LockName is the migration lock's name expression, for tests that hold it.
const LockName = lockName

// MigrateTo applies the migrations up to version upTo.
var MigrateTo = migrateTo

// SplitStatements cuts a migration into its statements.
var SplitStatements = splitStatements
