-- The usage report (admin API, `gateway report`) selects settled runs by the UTC day they
-- settled: without an index that is a scan of every hold ever taken, since holds are never
-- deleted. The cost on the hot path is one secondary-index entry per hold, changed once when
-- it settles. IF NOT EXISTS keeps a rerun after a crash between the DDL and the version row
-- harmless (MariaDB syntax; on MySQL 8 drop the clause).
CREATE INDEX IF NOT EXISTS idx_run_holds_settled_at ON run_holds (settled_at);
