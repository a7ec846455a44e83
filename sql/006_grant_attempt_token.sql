-- attempt_token is a random value one Grant call gives its insert and keeps across its
-- retries. When the reply to a grant's COMMIT is lost, the retry finds the grant by its key;
-- the token tells it the grant is its own (answered as created) rather than an earlier
-- delivery's (answered as a replay). NULL for grants made before this column existed. A rerun
-- after a crash between the DDL and the version row is harmless: Migrate tolerates
-- "duplicate column".
ALTER TABLE grants ADD COLUMN attempt_token CHAR(32) NULL;
