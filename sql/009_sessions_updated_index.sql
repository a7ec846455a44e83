-- The reconciler prunes sessions idle since before a point in time whose run has settled
-- (Store.PruneSessions): this index makes that a range read of the idle rows, not a scan (and
-- row locks) of the whole table on every pass. A rerun after a crash between the DDL and the
-- version row is harmless: Migrate tolerates "duplicate key name".
ALTER TABLE sessions ADD INDEX sessions_updated (updated_at);
