-- The operator's run listing (GET /admin/runs, `gateway runs`) pages newest first, by
-- created_at then run_id, optionally for one user: without these indexes every page read and
-- sorted every hold ever taken (holds are never deleted), or every hold of the user, so the
-- listing slowed down as the gateway aged. The cost on the hot path is two secondary-index
-- entries per admission, never changed afterwards (created_at does not move). A rerun after a
-- crash between the DDL and the version row is harmless: Migrate tolerates "duplicate key
-- name".
ALTER TABLE run_holds ADD INDEX idx_run_holds_created (created_at, run_id);
ALTER TABLE run_holds ADD INDEX idx_run_holds_user_created (user_id, created_at, run_id);
