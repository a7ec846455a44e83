-- A user's usage report (GET /admin/reports/usage?user=, `gateway report -user`, and a busy
-- range asked user by user) selects the user's settled runs by when they settled, and the
-- user's index was (user_id, state, expires_at): it read every run the user had kept and
-- filtered them by settled_at row by row, whatever the range (on a user with 15 000 kept runs,
-- 13 000 rows for a day's 250). (user_id, state, settled_at) serves what the old one served —
-- the admission aggregate and /v1/credits read a user's live holds by (user_id, state), and
-- no statement ranges over a user's expiry — and makes a user's report, and a user's listing
-- by settlement, a range read of the user's days. The cost on the hot path is no more than
-- before: an admission inserts one entry into it as it did into the old one, and a settlement
-- rewrites it as it rewrote the old one (state changes then anyway), while a named run's call
-- record or an extension, which move expires_at, no longer rewrite it. Built online, then the
-- old one dropped: admissions go on. A rerun after a crash between the statements and the
-- version row is harmless: Migrate tolerates "duplicate key name", and the drop of an index
-- already dropped.
ALTER TABLE run_holds ADD INDEX idx_run_holds_user_state_settled (user_id, state, settled_at);
ALTER TABLE run_holds DROP INDEX idx_run_holds_user_state_expires;
