-- The usage report (admin API, `gateway report`) selects settled runs by the UTC day they
-- settled: without an index that is a scan of every hold ever taken, since holds are kept
-- until `gateway prune` (migration 012) folds settled ones into their day's sums. The cost on
-- the hot path is one secondary-index entry per hold, changed once when it settles. Plain
-- CREATE INDEX runs on MariaDB and MySQL 8 alike; a rerun after a crash between the DDL and the
-- version row is harmless because Migrate tolerates "duplicate key name".
CREATE INDEX idx_run_holds_settled_at ON run_holds (settled_at);
