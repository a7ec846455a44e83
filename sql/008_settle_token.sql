-- settle_token is a random value one batch transaction gives each settlement it writes and
-- keeps across its retries. When the reply to the batch's COMMIT is lost, the retry finds the
-- run settled; the token tells it the run was settled by this very settlement (applied, as the
-- metrics and the reconciler's alerts count it) rather than by another. NULL for runs settled
-- before this column existed. A rerun after a crash between the DDL and the version row is
-- harmless: Migrate tolerates "duplicate column".
ALTER TABLE run_holds ADD COLUMN settle_token CHAR(32) NULL;
