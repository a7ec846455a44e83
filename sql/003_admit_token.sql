-- admit_token is a random value the gateway gives each admission request and keeps across its
-- retries. When the reply to an admission's COMMIT is lost, it is what tells that request's own
-- hold apart from one another request took on the same named run (Idempotency-Key, X-Run-Id):
-- a retry claims, and a refused caller releases, only the hold carrying its token. NULL for
-- holds taken before this column existed. A rerun after a crash between the DDL and the
-- version row is harmless: Migrate tolerates "duplicate column".
ALTER TABLE run_holds ADD COLUMN admit_token CHAR(32) NULL;
