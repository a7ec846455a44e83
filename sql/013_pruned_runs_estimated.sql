-- The usage report counts, per user, day and model, the runs charged an estimate (a call
-- without the provider's usage report: a cancelled, cut or timed-out call, a run reconciled
-- from its hold): their tokens are the gateway's count, not the provider's, which is what a
-- billing team needs to know when it sets the report against a provider's invoice. A prune
-- keeps that count with its sums. Runs pruned before this column existed count 0. A rerun
-- after a crash between the DDL and the version row is harmless: Migrate tolerates
-- "duplicate column".
ALTER TABLE pruned_runs ADD COLUMN estimated_runs BIGINT NOT NULL DEFAULT 0;
