package sql

// LockName is the migration lock's name expression, for tests that hold it.
const LockName = lockName
