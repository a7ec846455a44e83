-- The usage report of all users (GET /admin/reports/usage, `gateway report`) selects the day
-- ledger and the pruned sums by day, and both tables are keyed by user first: each report read
-- usage_days and pruned_runs whole, whatever its range, and neither is ever emptied (a row per
-- user and day, and per user, day and model of every day pruned). On 10 000 users with 60 days
-- of ledger and 120 of pruned sums, a report of one day read 900 000 rows for its 20 000. An
-- index by day makes it a range read of the report's days. The cost on the hot path is one
-- secondary-index entry per user and day, written when the day's first settlement inserts its
-- ledger row and never changed (day does not move; the ledger's amounts are not in the index);
-- only `gateway prune` writes pruned_runs. Both are built online: settlements go on. A rerun
-- after a crash between the statements and the version row is harmless: Migrate tolerates
-- "duplicate key name".
ALTER TABLE usage_days ADD INDEX idx_usage_days_day (day);
ALTER TABLE pruned_runs ADD INDEX idx_pruned_runs_day (day);
