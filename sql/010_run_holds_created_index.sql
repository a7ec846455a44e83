-- The operator's run listing (GET /admin/runs, `gateway runs`) pages newest first, by
-- created_at then run_id: without this index every page read and sorted every hold ever taken
-- (holds are kept until `gateway prune` folds settled ones away), so the listing slowed down as the gateway aged. The cost on the
-- hot path is one secondary-index entry per admission, never changed afterwards (created_at
-- does not move). A second index per user (user_id, created_at, run_id) was measured too: the
-- two together took the 256-connection benchmark from 0.39 to 0.37 × the plain proxy in
-- alternating runs, so one user's listing keeps using the user's index and sorts that user's
-- runs only. A rerun after a crash between the DDL and the version row is harmless: Migrate
-- tolerates "duplicate key name".
ALTER TABLE run_holds ADD INDEX idx_run_holds_created (created_at, run_id);
